"""The one kind of error a user can fix by changing what they typed or wrote: every module's own
(a scenario field, a run folder, a shard, a comparison) derives from it, and the CLI turns it into
a plain message and exit status 2, with nothing written."""


class UserError(Exception):
    pass
