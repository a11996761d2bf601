"""The command line: parse, call, render. No computation lives here."""
