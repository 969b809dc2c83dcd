"""The two kinds of error the command line reports without a traceback.

``UserError``: input a user can fix by changing what they typed or wrote (a scenario field, a run
folder, a shard, a comparison): every module's own such error derives from it, and the CLI says it
plainly and exits 2, before any GPU work.  ``RunFailed``: work that started and could not finish
(a worker that crashed, benchmarks that failed): said plainly, exit 1, whatever was recorded kept.  And how a
message names an error or a near miss (``first_line``, ``did_you_mean``)."""


class UserError(Exception):
    pass


class RunFailed(Exception):
    pass


def did_you_mean(word, options) -> str:
    """' (did you mean 'x'?)' where ``word`` is close to one of ``options``, for the message that refuses it."""
    import difflib

    close = difflib.get_close_matches(str(word), list(options), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def first_line(e: BaseException) -> str:
    """'OutOfMemoryError: CUDA out of memory. ...': an exception's type and its message's first line."""
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"
