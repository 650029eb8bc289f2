"""Names on the wire between a worker (``worker.engine_client``) and the engine server (``api.engine_server``),
in one place both sides import."""

OPTIONS_HEADER = "x-diarist-options"
"""Request header carrying the job options as ASCII JSON; in the URL they (the prompt) would reach access logs."""
JOB_ID_HEADER = "x-diarist-job-id"
"""Request header naming the job, so the engine server's log lines about the request carry its id."""
ADMISSION_CLASS_HEADER = "x-diarist-admission-class"
"""Request header naming the job's duration class (``short``, ``long``; absent: ``default``), which the engine
server sets on every engine sequence of the request (``Sequence.admission_class``) for per-class admission."""
