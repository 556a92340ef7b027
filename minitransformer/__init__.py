"""minitransformer."""
