"""A running JVM's own counters, read as `jcmd PID PerfCounter.print` prints them but without a
JDK (the kit installs a JRE): the hsperfdata file the JVM keeps in /tmp/hsperfdata_<user>/<pid>.

    counters(pid)["java.threads.started"]     # threads the JVM has started since its start
"""

from __future__ import annotations

import getpass
import struct
from pathlib import Path

MAGIC = 0xCAFEC0C0
LITTLE_ENDIAN = 1  # the header's byte-order byte
HEADER = struct.Struct(">IB")  # the magic is big-endian whatever the order of the rest
ENTRIES_AT = 24  # the header's entry offset and entry count, in the file's byte order
LONG = ord("J")  # a scalar long entry (vectors are strings and arrays)


def counters(pid: int) -> dict[str, int]:
    """The JVM's scalar long counters by name."""
    data = (Path("/tmp") / f"hsperfdata_{getpass.getuser()}" / str(pid)).read_bytes()
    magic, order = HEADER.unpack_from(data)
    assert magic == MAGIC, f"not a JVM's hsperfdata file: magic {magic:#x}"
    e = "<" if order == LITTLE_ENDIAN else ">"
    offset, count = struct.unpack_from(f"{e}ii", data, ENTRIES_AT)
    found = {}
    for _ in range(count):
        length, name_at, vector, kind, _flags, _units, _variability, value_at = struct.unpack_from(
            f"{e}iiiBBBBi", data, offset
        )
        name = data[offset + name_at : data.index(b"\0", offset + name_at)].decode()
        if vector == 0 and kind == LONG:
            found[name] = struct.unpack_from(f"{e}q", data, offset + value_at)[0]
        offset += length
    return found
