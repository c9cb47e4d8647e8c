"""The admin console at /admin: server-rendered pages (Jinja2 templates and a stylesheet
shipped in the package, nothing from a CDN, no JavaScript needed) over the key store,
teams, usage, cost, audit and backend health."""
