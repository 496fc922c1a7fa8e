"""The forecast of demand: runs due per minute over the next minutes, by runner kind."""
