"""Local servers that speak the providers' wire formats, for adapter tests without a network."""
