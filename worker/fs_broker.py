"""kombu's filesystem transport with atomic publishing, for ``DIARIST_BROKER_URL=filesystem://``.

kombu's own ``filesystem`` transport creates a message file under its final name and then writes it; a
consumer in another process can take (move) and read the file in between and gets an empty or partial
message, which fails to decode and is lost (seen with the API and two worker processes: 3 of 6 jobs never
ran). Here a message is written under a name consumers skip and renamed into place (``os.replace``, atomic
within a folder), so a consumer sees a whole message or none. Registered as the transport ``diaristfs``.
"""

from __future__ import annotations

import os
import uuid
from time import monotonic

from kombu.transport import TRANSPORT_ALIASES, filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps

ALIAS = "diaristfs"


class Channel(filesystem.Channel):
    def _put(self, queue: str, payload: dict, **kwargs: object) -> None:
        """Put ``payload`` onto ``queue``: written as ``.<name>.tmp``, then renamed to ``<name>``, whose
        ``<ms>_<uuid>.<queue>.msg`` form (kombu's) keeps the consumers' order and queue filter."""
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        tmp = os.path.join(self.data_folder_out, f".{name}.tmp")
        with open(tmp, "wb") as f:
            f.write(str_to_bytes(dumps(payload)))
        os.replace(tmp, os.path.join(self.data_folder_out, name))


class Transport(filesystem.Transport):
    Channel = Channel


TRANSPORT_ALIASES.setdefault(ALIAS, f"{__name__}:Transport")
