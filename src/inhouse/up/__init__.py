"""`inhouse up`: engines and a gateway before them, started together; sits above both the
gateway and the launchers."""
