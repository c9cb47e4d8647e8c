"""Operating inhouse: Prometheus alerting rules, a Grafana dashboard and scrape targets.

Everything here is generated from code (``inhouse observe …``) so the thresholds follow a
team's SLO and plan; ``deploy/`` holds the files generated with the defaults.
"""
