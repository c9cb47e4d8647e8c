"""A server-rendered SVG bar chart (no JavaScript, no CDN): tokens per day."""

from __future__ import annotations

from html import escape

WIDTH, HEIGHT = 720, 260
LEFT, BOTTOM, TOP = 64, 40, 24


def bar_chart(points: list[tuple[str, int, int]], title: str) -> str:
    """Stacked bars of (label, prompt tokens, completion tokens), one per day."""
    peak = max((p + c for _, p, c in points), default=0) or 1
    plot_w, plot_h = WIDTH - LEFT - 16, HEIGHT - TOP - BOTTOM
    step = plot_w / max(len(points), 1)
    bar = min(max(step * 0.7, 1.0), 48.0)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="{escape(title)}">',
        f"<title>{escape(title)}</title>",
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="#fff"/>',
        f'<text x="{LEFT}" y="16" font-size="13" font-family="sans-serif">{escape(title)}</text>',
    ]
    for fraction in (0, 0.5, 1):
        y = TOP + plot_h * (1 - fraction)
        parts.append(f'<line x1="{LEFT}" x2="{WIDTH - 16}" y1="{y:.1f}" y2="{y:.1f}" '
                     'stroke="#ddd"/>')  # fmt: skip
        parts.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" font-size="11" text-anchor="end" '
                     f'font-family="sans-serif">{_short(peak * fraction)}</text>')  # fmt: skip
    for i, (label, prompt, completion) in enumerate(points):
        x = LEFT + i * step + (step - bar) / 2
        h_prompt, h_completion = plot_h * prompt / peak, plot_h * completion / peak
        base = TOP + plot_h
        parts.append(f'<rect x="{x:.1f}" y="{base - h_prompt:.1f}" width="{bar:.1f}" '
                     f'height="{h_prompt:.1f}" fill="#4477aa"><title>{escape(label)}: '
                     f'{prompt} input tokens</title></rect>')  # fmt: skip
        parts.append(f'<rect x="{x:.1f}" y="{base - h_prompt - h_completion:.1f}" '
                     f'width="{bar:.1f}" height="{h_completion:.1f}" fill="#ee7733"><title>'
                     f'{escape(label)}: {completion} output tokens</title></rect>')  # fmt: skip
        if len(points) <= 12 or i % max(len(points) // 8, 1) == 0:
            parts.append(f'<text x="{x + bar / 2:.1f}" y="{HEIGHT - BOTTOM + 16}" '
                         'font-size="10" text-anchor="middle" font-family="sans-serif">'
                         f'{escape(label[5:])}</text>')  # fmt: skip
    legend_y = HEIGHT - 8
    parts += [
        f'<rect x="{LEFT}" y="{legend_y - 9}" width="10" height="10" fill="#4477aa"/>',
        f'<text x="{LEFT + 14}" y="{legend_y}" font-size="11" font-family="sans-serif">'
        "input tokens</text>",
        f'<rect x="{LEFT + 110}" y="{legend_y - 9}" width="10" height="10" fill="#ee7733"/>',
        f'<text x="{LEFT + 124}" y="{legend_y}" font-size="11" font-family="sans-serif">'
        "output tokens</text>",
        "</svg>",
    ]
    return "\n".join(parts)


def _short(value: float) -> str:
    for unit, size in (("M", 1e6), ("k", 1e3)):
        if value >= size:
            return f"{value / size:.1f}{unit}"
    return f"{value:.0f}"
