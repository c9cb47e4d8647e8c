"""What serving costs: the `[cost]` settings, the arithmetic against a hosted API, and the
report `inhouse cost` prints from the gateway's audit."""
