"""OpenAI protocol models and error shapes, shared by server, gateway and bench."""
