"""kombu's Redis transport, guarded so that a broker restart under a running job cannot end the worker.

The failure (kombu 5.7.0 / celery 5.7.0, the newest releases; the same ``_connparams`` AttributeError is
celery/kombu#582, its restore path celery/kombu#970 and celery/celery#10205, none fixed for this path):
when the broker connection drops while a job is running (``acks_late``: its message is unacked),
Celery's consumer first ``collect()``s the connection, which closes the default channel (that close
raises a connection error part-way, so the channel stays open) and then detaches the transport
(``transport.client = None``); it then ``close()``s the connection, which closes that channel again,
and closing restores the unacked message, which needs a new Redis pool built from
``self.connection.client``: ``None``. The ``AttributeError`` is not one of the transport's connection
errors, so ``ignore_errors`` lets it through and the worker stops with "Unrecoverable error".

Here a channel whose transport was detached raises :class:`redis.exceptions.ConnectionError` instead,
which every caller (Celery's reconnect, ``maybe_close_channel``, an ack from a task thread) already
treats as "the broker is gone". Nothing is lost by not restoring from that channel: the broker was
unreachable at that moment anyway, the message stays in Redis' unacked hash (restored after the
visibility timeout), and a broker that lost it is re-driven by the sweeper (worker/sweeper.py).
Registered as the transport ``diaristredis``; :func:`worker.celery_app.configure` maps ``redis://``
URLs onto it.

The same outage makes kombu log "Couldn't ack <tag>, reason: DetachedChannelError(...)" at CRITICAL with a
traceback for each job that ends while the broker is away. That is expected and harmless (the message stays
in Redis' unacknowledged hash; once restored it is redelivered and skipped, since the job row is final:
docs/operations.md, "Unacknowledged messages"), so :class:`LostAckFilter` makes it one WARNING line without
a traceback, carrying the job id (:class:`worker.tasks.JobRequest` acknowledges inside the job's context).
"""

from __future__ import annotations

import logging

from kombu.transport import TRANSPORT_ALIASES, redis
from redis.exceptions import ConnectionError as RedisConnectionError

ALIAS = "diaristredis"
ACK_LOGGER = "celery.worker.request"
"""The logger Celery passes to kombu's ``Message.ack_log_error`` / ``reject_log_error``."""


class DetachedChannelError(RedisConnectionError):
    """A channel of a connection whose transport Celery already detached (the broker connection was lost)."""


class Channel(redis.Channel):
    def _connparams(self, asynchronous: bool = False) -> dict:
        """kombu's connection parameters; :class:`DetachedChannelError` (a connection error) when the
        transport no longer has its client (see the module docstring) instead of an AttributeError."""
        if self.connection is None or self.connection.client is None:
            raise DetachedChannelError("the broker connection of this channel was closed (Redis connection lost)")
        return super()._connparams(asynchronous=asynchronous)


class Transport(redis.Transport):
    Channel = Channel


TRANSPORT_ALIASES.setdefault(ALIAS, f"{__name__}:Transport")


class LostAckFilter(logging.Filter):
    """Turns kombu's "Couldn't ack/reject <tag>, reason: <error>" record, when the error is a lost Redis
    connection, into one WARNING line without a traceback; any other record passes unchanged."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = str(record.msg)
        if not msg.startswith(("Couldn't ack", "Couldn't reject")) or not isinstance(record.args, tuple) \
                or len(record.args) != 2 or not isinstance(record.args[1], RedisConnectionError):
            return True
        tag, exc = record.args
        verb = "acknowledged" if msg.startswith("Couldn't ack") else "rejected"
        record.msg = ("message %s not %s: the broker connection was lost (%s: %s); Redis keeps it "
                      "unacknowledged and redelivers it after the visibility timeout, where the job row "
                      "makes it a no-op")
        record.args = (tag, verb, type(exc).__name__, exc)
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.exc_info, record.exc_text = None, None
        return True


def install_lost_ack_filter() -> None:
    """Add :class:`LostAckFilter` to Celery's request logger (once per process)."""
    logger = logging.getLogger(ACK_LOGGER)
    if not any(isinstance(f, LostAckFilter) for f in logger.filters):
        logger.addFilter(LostAckFilter())
