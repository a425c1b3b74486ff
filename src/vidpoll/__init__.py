"""vidpoll."""
