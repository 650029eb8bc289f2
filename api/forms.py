"""Multipart forms: a request carries one recording (``file``), and a second file is refused with its own code.

Two files in one request are a client's mistake (``-F file=@a.wav -F file=@b.wav``), never a batch: which one
would be transcribed is a guess, so both routes that take an upload answer 422 ``multiple_files`` and
create no job.
"""

from __future__ import annotations

from fastapi import Request
from starlette.datastructures import FormData, UploadFile
from starlette.exceptions import HTTPException

from diarist.http.errors import ApiError

# Starlette's MultiPartParser refuses the file past ``max_files`` with this text (its only file-count error).
_TOO_MANY_FILES = "Too many files"


def multiple_files(names: list[str] | None = None) -> ApiError:
    """422 ``multiple_files``; ``names``: the upload's file names, when known."""
    which = f" ({', '.join(repr(n) for n in names)})" if names else ""
    return ApiError(422, "multiple_files", f"the request carries more than one file{which}; send one recording "
                    "per request, in the multipart field `file`")


async def read_form(request: Request, max_fields: int) -> FormData:
    """The request's multipart form, parsed with room for one file only (a second one is not spooled).

    Raises ApiError 422 ``multiple_files`` for a second file; Starlette's 400 for a malformed body.
    """
    try:
        return await request.form(max_files=1, max_fields=max_fields)
    except HTTPException as e:
        if e.status_code == 400 and str(e.detail).startswith(_TOO_MANY_FILES):
            raise multiple_files() from None
        raise


def check_one_file(form: FormData) -> None:
    """422 ``multiple_files`` when ``form`` (already parsed, e.g. by FastAPI for ``File()`` parameters) holds
    more than one file."""
    files = [v for _, v in form.multi_items() if isinstance(v, UploadFile)]
    if len(files) > 1:
        raise multiple_files([f.filename or "" for f in files])
