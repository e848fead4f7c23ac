"""A file tool in Python over a granted directory: read a file, search for a
text. It declares `/data` read-only; the host decides which host directory (if
any) appears there. Paths are relative to `/data`; escapes fail. The same Tools
as the Rust `files` example."""

import os
from dataclasses import dataclass
from typing import Optional

from toolgate_sdk import Annotations, Capabilities, Context, Failed, Tool, export_tools

ROOT = "/data"
MAX_READ = 256 * 1024
NEEDS = Capabilities().directory(ROOT, "read")
READ_ONLY = Annotations(read_only=True, idempotent=True, open_world=False)


def resolve(path: str) -> str:
    return f"{ROOT}/{path.lstrip('/')}"


@dataclass
class ReadArgs:
    """Arguments of `files.read`.

    Attributes:
        path: Path relative to the data directory, e.g. `notes/today.md`.
    """

    path: str


class Read(Tool):
    ID = "files.read"
    DESCRIPTION = "Read a UTF-8 text file (at most 256 KiB) from the data directory."
    PRIMARY_ARGUMENT = "path"
    CAPABILITIES = NEEDS
    ANNOTATIONS = READ_ONLY

    def call(self, args: ReadArgs, cx: Context) -> str:
        path = resolve(args.path)
        try:
            size = os.stat(path).st_size
            if size > MAX_READ:
                raise Failed(f"`{args.path}` is {size} bytes, more than {MAX_READ}")
            with open(path, encoding="utf-8") as f:
                return f.read()
        except OSError as e:
            raise Failed(f"cannot read `{args.path}`: {e.strerror or e}") from None


@dataclass
class SearchArgs:
    """Arguments of `files.search`.

    Attributes:
        query: Text to look for (case-sensitive).
        dir: Directory to search, relative to the data directory; default the whole of it.
    """

    query: str
    dir: Optional[str] = None


@dataclass
class Hit:
    """One match.

    Attributes:
        path: File, relative to the data directory.
        line: 1-based line number.
        text: The line.
    """

    path: str
    line: int
    text: str


class Search(Tool):
    ID = "files.search"
    DESCRIPTION = "Find lines containing a text in the files of the data directory (at most 100 hits)."
    PRIMARY_ARGUMENT = "query"
    CAPABILITIES = NEEDS
    ANNOTATIONS = READ_ONLY

    def call(self, args: SearchArgs, cx: Context) -> list[Hit]:
        hits: list[Hit] = []
        stack = [(args.dir or "").strip("/")]
        while stack:
            rel = stack.pop()
            try:
                entries = sorted(os.scandir(resolve(rel)), key=lambda e: e.name)
            except OSError as e:
                raise Failed(f"cannot list `{rel}`: {e.strerror or e}") from None
            for entry in entries:
                child = entry.name if not rel else f"{rel}/{entry.name}"
                if entry.is_dir(follow_symlinks=False):
                    stack.append(child)
                elif entry.is_file(follow_symlinks=False):
                    try:
                        with open(resolve(child), encoding="utf-8") as f:
                            lines = f.read().splitlines()
                    except (OSError, UnicodeDecodeError):
                        continue
                    for i, line in enumerate(lines):
                        if args.query in line:
                            hits.append(Hit(child, i + 1, line))
                            if len(hits) >= 100:
                                return hits
        hits.sort(key=lambda h: (h.path, h.line))
        return hits


export_tools(Read, Search)
