"""The read job of the disk tier: one chunk file into its arena region, verified (reader threads).

The region was reserved by the pipeline (:mod:`.promotions`) before the read started; the file is
read with O_DIRECT where the filesystem allows it and checked like any chunk file (header, key,
namespace, payload checksum). The outcome goes back to the loop thread as a word and a detail.
"""

from __future__ import annotations

import errno
import logging
import os
from typing import Any

from infera.kvd import chunkfile as cf
from infera.kvd import envvars
from infera.kvd.arena import align_up
from infera.kvd.keyspace import fkey_key
from infera.kvd.tiers.diskfs import file_path, quarantine
from infera.kvd.tiers.promotions import OK, ReadJob

log = logging.getLogger("infera.kvd.disk")

# outcomes besides OK; the tier accounts each (DiskTier.read_failed)
MISSING, IGNORED, SIZE, OTHER, CORRUPT, ERROR = "missing", "ignored", "size", "other", "corrupt", "error"


class FileReader:
    def __init__(self, arena: memoryview, root: str, root_fd: int) -> None:
        self._arena = arena
        self.root = root
        self.root_fd = root_fd
        self.direct = bool(envvars.get("INFERA_KVD_DISK_DIRECT", 1))

    def read(self, job: ReadJob) -> tuple[str, Any]:
        """File -> arena region, verified; recency (the file's mtime) is refreshed."""
        chunk = job.chunk
        assert chunk is not None
        path = file_path(self.root, job.where)
        view = self._arena[chunk.offset : chunk.offset + align_up(chunk.length)]
        key = fkey_key(job.where)
        digest = job.ns.digest
        try:
            try:
                cf.read_into(path, view, length=chunk.length, digest=digest, key=key, direct=self.direct)
            except OSError as exc:
                if exc.errno != errno.EINVAL or not self.direct:
                    raise
                self.direct = False  # this filesystem refuses O_DIRECT (tmpfs): use the page cache
                log.info("disk tier: %s does not support O_DIRECT; reading through the page cache", self.root)
                cf.read_into(path, view, length=chunk.length, digest=digest, key=key)
            # recency survives a restart: the index is rebuilt in mtime order
            os.utime(path, follow_symlinks=False)
        except FileNotFoundError:
            return MISSING, None
        except cf.NotRegular as exc:  # a link, FIFO or directory put there since it was indexed
            return IGNORED, str(exc)
        except cf.SizeChanged as exc:
            return SIZE, exc.size
        except cf.OtherVersion as exc:
            return OTHER, str(exc)
        except cf.CorruptChunk as exc:
            return CORRUPT, (f"{path}: {exc}", quarantine(self.root_fd, job.where))
        except OSError as exc:
            return ERROR, exc
        finally:
            view.release()
        return OK, None


__all__ = ["CORRUPT", "ERROR", "IGNORED", "MISSING", "OTHER", "SIZE", "FileReader"]
