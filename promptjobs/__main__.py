"""`python -m promptjobs` is the `promptjobs` command."""

from promptjobs.cli import main

main()
