"""What serving costs: the `[cost]` settings and the arithmetic against a hosted API. The
gateway measures the traffic from its audit (`gateway.usage.traffic`) and runs `inhouse cost`
(`gateway.usage.cost_command`)."""
