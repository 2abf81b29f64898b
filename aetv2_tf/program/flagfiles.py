"""The flagfiles of a command line, read with limits before absl reads them.

absl reads each ``--flagfile=`` whole with a plain `open` (a FIFO blocks it, ``/dev/zero``
fills the memory, a loop overflows the stack). `expand` reads them first, as absl would, and
refuses (`UsageError` naming the file, the flagfile that named it and the fix) what is not a
regular file, too large (`MAX_FLAGFILE_BYTES`, one or all), too many (`MAX_FLAGFILES`), a loop,
or not text in the locale's encoding; a missing file stays absl's error.
"""

from __future__ import annotations

import io
import locale
import os
import sys
from collections.abc import Sequence

from absl import app, flags

from aetv2_tf.errors import UsageError
from aetv2_tf.files.safe_paths import MAX_RECORD_BYTES, read_regular_file

#: The most bytes of one flagfile, and of all a command line names (a config: about 1 KB).
MAX_FLAGFILE_BYTES = MAX_RECORD_BYTES
#: The most flagfiles read for one command line, nested ones and repeats counted.
MAX_FLAGFILES = 64
_DIRECTIVES = ("--flagfile=", "-flagfile=")
_FIX = "a flagfile is a text file of flags, one per line (configs/*.cfg): pass one"


def _named(arg: str) -> str:
    """The file of a ``--flagfile=NAME`` argument or line, as absl takes it."""
    return os.path.expanduser(arg.split("=", 1)[1].strip())


class _Reader:
    """Reads the flagfiles of one command line, counting them and their bytes."""

    def __init__(self) -> None:
        self.files, self.size = 0, 0

    def lines(self, name: str, chain: tuple[tuple[str, tuple[int, int]], ...]) -> list[str]:
        """The flag lines of the flagfile ``name``, nested ones expanded (as absl's
        `_get_flag_file_lines`); ``chain``: ``(name, (st_dev, st_ino))`` of those naming it."""
        if not name:  # absl skips `--flagfile=` (an empty name)
            return []
        where = f"--flagfile={name}" + (f" (named in {chain[-1][0]})" if chain else "")
        try:
            status = os.stat(name)
        except ValueError:  # a NUL byte in the name
            raise UsageError(f"{where}: a file name cannot hold a NUL byte; {_FIX}") from None
        except OSError as e:
            raise flags.CantOpenFlagFileError(f"ERROR:: Unable to open flagfile: {e}") from None
        identity = (status.st_dev, status.st_ino)
        if identity in (known for _, known in chain):
            loop = " -> ".join([*(file for file, _ in chain), name])
            raise UsageError(f"{where}: the flagfile names itself ({loop}); remove the "
                             "--flagfile line that closes the loop")
        self.files += 1
        if self.files > MAX_FLAGFILES:
            raise UsageError(f"{where}: more than {MAX_FLAGFILES} flagfiles for one command "
                             "line (nested ones and repeats counted); name each file once")
        try:
            data = read_regular_file(name, _FIX, MAX_FLAGFILE_BYTES)
        except OSError as e:
            raise flags.CantOpenFlagFileError(f"ERROR:: Unable to open flagfile: {e}") from None
        except UsageError as e:
            raise UsageError(f"{where}: {str(e)[len(name) + 2:]}") from None  # "{name}: ..."
        self.size += len(data)
        if self.size > MAX_FLAGFILE_BYTES:
            raise UsageError(f"{where}: the flagfiles of this command line hold more than "
                             f"{MAX_FLAGFILE_BYTES} bytes together; name each file once")
        encoding = locale.getpreferredencoding(False)
        try:
            text = data.decode(encoding)
        except UnicodeDecodeError as e:
            raise UsageError(f"{where}: not {encoding} text ({e.reason} at byte {e.start}); "
                             f"{_FIX}") from None
        return self._flags(io.StringIO(text, newline=None).readlines(),
                           (*chain, (name, identity)))

    def _flags(self, lines: list[str], chain) -> list[str]:
        """The flags of ``lines``: no blanks or comments, nested flagfiles expanded."""
        out = []
        for line in lines:
            if line.isspace() or line.startswith(("#", "//")):
                continue
            if line.startswith(_DIRECTIVES):
                out.extend(self.lines(_named(line), chain))
            elif line in ("--flagfile", "-flagfile"):  # absl: only on a last line, no newline
                raise flags.Error(f"Hit illegal --flagfile type: {line}")
            else:
                out.append(line.strip())
        return out


def expand(args: Sequence[str]) -> list[str]:
    """``args`` (no program name) with each flagfile's flags in its place, as absl's
    `read_flags_from_files` (nothing after ``--``); `UsageError`, or absl's `flags.Error`."""
    reader, out, rest = _Reader(), [], list(args)
    while rest:
        arg = rest.pop(0)
        if arg in ("--flagfile", "-flagfile"):  # the name is the next argument
            if not rest:
                raise flags.IllegalFlagValueError("--flagfile with no argument")
            out.extend(reader.lines(os.path.expanduser(rest.pop(0)), ()))
        elif arg.startswith(_DIRECTIVES):
            out.extend(reader.lines(_named(arg), ()))
        else:
            out.append(arg)
            if arg == "--":
                out.extend(rest)
                break
    return out


def parse_command_line(argv: Sequence[str]) -> list[str]:
    """`absl.app.run`'s ``flags_parser``: `expand` (exit 2, or 1 for absl's errors), then
    `absl.app.parse_flags_with_usage` of ``argv``."""
    try:
        expand(argv[1:])
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        sys.exit(2)
    except flags.Error as e:
        sys.stderr.write(f"FATAL Flags parsing error: {e}\n"
                         "Pass --helpshort or --helpfull to see help on flags.\n")
        sys.exit(1)
    return app.parse_flags_with_usage(argv)
