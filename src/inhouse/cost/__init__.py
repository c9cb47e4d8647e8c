"""What serving costs: the `[cost]` settings and the arithmetic against a hosted API. The
gateway measures the traffic from its audit (`gateway.traffic`) and runs `inhouse cost`
(`gateway.cost_command`)."""
