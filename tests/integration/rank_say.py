"""say(): how a test's rank script prints a line the test parses.

Ranks share the agent's stdout, unbuffered (the agent sets PYTHONUNBUFFERED=1),
and print() writes the text and its newline separately, so two ranks' lines
can interleave; one os.write per line cannot."""
import os


def say(line):
    os.write(1, (line + "\n").encode())
