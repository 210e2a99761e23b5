"""The one exception type for a user's mistake (flag, path, data file, checkpoint, config).

Entry points catch it, print its message as one line and exit with code 2, no traceback.
The message names the problem and the fix.
"""


class UserError(Exception):
    """A mistake the user can fix; its message says what is wrong and what to do."""
