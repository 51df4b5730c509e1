"""The exception types ember raises; leaf module, imports nothing from ember.

imports: nothing of ember
"""


class EmberError(Exception):
    """Base class of every error ember raises on purpose."""


class ConfigError(EmberError):
    """A configuration field, flag or data/model spec is invalid; names it and what is allowed."""


class ProtocolError(EmberError):
    """A frame or message violated the wire protocol (bad HMAC, size, shape or dtype)."""


class ServerUnavailable(EmberError):
    """A parameter server did not answer within the timeout; names its address."""


class ServerGone(ServerUnavailable):
    """The connection to a parameter server broke (its process died): try its replica or its
    restart."""


class NotPrimary(ServerUnavailable):
    """A server answered that it is a backup, not the primary of its shard."""


class WorkerFailed(EmberError):
    """A worker process raised or died; carries its rank, exit code and last output lines."""


class CheckpointError(EmberError):
    """A checkpoint is missing, truncated or corrupt; names the file."""


class Interrupted(KeyboardInterrupt):
    """SIGTERM asked the launcher to stop: handled as Ctrl-C is (children reaped, a last
    checkpoint of the servers written); args[0] is the signal number."""


# What a worker raises before its first step that it would raise again if started again: its
# data, the model factory or the user's own code is at fault, not a peer, a server or the
# network (those raise ServerUnavailable, ProtocolError or OSError, which a restart may cure).
SAME_EVERY_TIME = (
    ConfigError,
    ImportError,
    SyntaxError,
    NameError,
    AttributeError,
    TypeError,
    ValueError,
    LookupError,
    NotImplementedError,
)


def same_every_time(exc: BaseException, started: bool) -> bool:
    """Whether restarting a worker that raised `exc` (`started`: after reporting its start,
    i.e. once its data, model and connections were ready) can only end the same way."""
    return not started and isinstance(exc, SAME_EVERY_TIME)
