"""The one exception type that means "the user got something wrong"."""


class UserError(Exception):
  """A mistake in names, flags, shapes, paths or checkpoints.

  The message is one sentence that says what is wrong and how to fix it;
  main.py prints it as `error: <message>` and exits with status 2.
  """
