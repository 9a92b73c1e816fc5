package pylog.spark.jvm;

import java.io.IOException;
import java.nio.ByteBuffer;

/**
 * The batches of one remote segment, from the indexed batch at or before an offset on, read in windows
 * of {@link RemoteObjects#window()} bytes: the checks of {@code pylog.partition.remote.read_raw}. The
 * {@code .index} object is only a hint (an entry pointing at something that is not the batch it names is
 * ignored, and the walk starts at the first byte); every base offset must continue the one before; the
 * segment must end where its manifest says (offset and size); a corrupt batch names the object's key.
 *
 * <p>Not thread-safe: one per task's current segment.
 */
final class RemoteWalk {
  private final RemoteObjects objects;
  final NativePartition.RemoteSeg seg;
  private final BatchDecoder.Header h = new BatchDecoder.Header();

  /** Object bytes {@code [shift, shift + buf.limit())}. */
  ByteBuffer buf;

  private long shift;
  private long pos;
  private long expected;
  private boolean fromIndex;
  /** Where the current batch starts in {@link #buf}. */
  int at;

  RemoteWalk(RemoteObjects objects, NativePartition.RemoteSeg seg, long offset) {
    this.objects = objects;
    this.seg = seg;
    this.pos = 0;
    this.expected = seg.base;
    if (offset > seg.base) {
      indexFloor(offset);
    }
  }

  /** Where valid bytes of {@link #buf} end (the window, or the segment's end within it). */
  int limit() {
    return (int) Math.min(buf.limit(), seg.size - shift);
  }

  /** The header of the next batch (its bytes in {@link #buf} at {@link #at}), or null at the segment's end. */
  BatchDecoder.Header next() throws IOException {
    if (!fromIndex) {
      return step();
    }
    fromIndex = false;
    try {
      return step();
    } catch (PylogReadException e) {
      if (!PylogReadException.CORRUPT.equals(e.pylogClass())) {
        throw e;
      }
      pos = 0; // the index pointed at something that is not the batch it names: from the first byte
      expected = seg.base;
      buf = null;
      return step();
    }
  }

  private BatchDecoder.Header step() throws IOException {
    if (pos >= seg.size) {
      if (expected != seg.next) {
        throw corrupt(pos, "segment ends at offset " + expected + ", its manifest says " + seg.next);
      }
      return null;
    }
    if (buf == null || pos - shift + BatchDecoder.HEADER_SIZE > buf.limit()) {
      fetch(BatchDecoder.HEADER_SIZE);
    }
    int rel = (int) (pos - shift);
    if (rel + BatchDecoder.HEADER_SIZE > limit()) {
      throw corrupt(pos, "truncated batch header");
    }
    int length = buf.getInt(rel + 8);
    if (length >= BatchDecoder.HEADER_SIZE && pos + length <= seg.size && rel + length > buf.limit()) {
      fetch(length);
      rel = 0;
    }
    try {
      BatchDecoder.header(buf, rel, limit(), h);
    } catch (PylogReadException e) {
      throw corrupt(pos, e.getMessage());
    }
    if (h.baseOffset != expected) {
      throw corrupt(pos, "batch has base offset " + h.baseOffset + ", expected " + expected);
    }
    at = rel;
    expected = h.lastOffset() + 1;
    pos += h.batchLength;
    return h;
  }

  private void fetch(int atLeast) throws IOException {
    long want = Math.min(Math.max((long) objects.window(), atLeast), seg.size - pos);
    ByteBuffer got = objects.read(seg.key, seg.url, pos, (int) want);
    if (got.limit() < want) {
      throw corrupt(pos, "object holds " + (pos + got.limit()) + " bytes, its manifest says " + seg.size);
    }
    buf = got;
    shift = pos;
  }

  /** Start at the greatest indexed batch at or before {@code offset}; any failure of the index: at 0. */
  private void indexFloor(long offset) {
    if (seg.indexSize < 8 || seg.indexKey == null || (seg.indexUrl == null && !objects.isFile())) {
      return;
    }
    ByteBuffer entries;
    try {
      entries = objects.read(seg.indexKey, seg.indexUrl, 0, (int) seg.indexSize);
    } catch (IOException | RuntimeException e) {
      return; // only a hint: the segment itself says what is wrong, if anything is
    }
    long rel = offset - seg.base;
    int lo = 0;
    int hi = entries.limit() / 8;
    while (lo < hi) {
      int mid = (lo + hi) >>> 1;
      if (Integer.toUnsignedLong(entries.getInt(mid * 8)) <= rel) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    if (lo == 0) {
      return;
    }
    long entryRel = Integer.toUnsignedLong(entries.getInt((lo - 1) * 8));
    long entryPos = Integer.toUnsignedLong(entries.getInt((lo - 1) * 8 + 4));
    if (entryPos >= seg.size) {
      return;
    }
    pos = entryPos;
    expected = seg.base + entryRel;
    fromIndex = entryPos > 0;
  }

  PylogReadException corrupt(long at, String what) {
    return new PylogReadException(
        "corrupt batch in remote segment " + seg.key + " at position " + at + ": " + what);
  }
}
