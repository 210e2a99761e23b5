"""What minidl's command lines share: an argparse parser whose mistakes are one line.

A bad flag raises UserError instead of printing usage and exiting, so every entry point
reports it the way it reports any user error: `PROG: error: <what and the fix>`, exit code 2.
"""
import argparse

from minidl.errors import UserError


class OneLineErrorParser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register("action", "on_off", argparse.BooleanOptionalAction)  # --flag / --no-flag

    def error(self, message):
        raise UserError(f"{message} (see --help)")
