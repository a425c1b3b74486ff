"""`python -m vidpoll.cli`: the `vidpoll` command."""

from vidpoll.cli import main

main()
