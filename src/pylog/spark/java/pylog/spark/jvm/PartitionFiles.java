package pylog.spark.jvm;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.MappedByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * The published segments of one partition, read the way {@code pylog.spark.snapshot.PartitionView} reads
 * them: the seqlocked {@code partition.state} (log end offset, active segment and its published size) and
 * the {@code .log} files listed in the directory, re-listed until the state is the same before and after.
 *
 * <p>Read-only: no file is created, locked or changed. Immutable once built.
 */
final class PartitionFiles {
  private static final Pattern SEGMENT = Pattern.compile("^(\\d{20})\\.log$");
  private static final long STATE_MAGIC =
      ByteBuffer.wrap("PLPSTAT1".getBytes(java.nio.charset.StandardCharsets.US_ASCII))
          .order(ByteOrder.LITTLE_ENDIAN)
          .getLong();

  /**
   * One segment: {@code size} published bytes holding offsets in {@code [base, next)}; {@code sealed} when
   * it is not the last segment (no writer appends to it any more).
   */
  static final class Segment {
    final Path path;
    final long base;
    final long next;
    final long size;
    final boolean sealed;

    Segment(Path path, long base, long next, long size, boolean sealed) {
      this.path = path;
      this.base = base;
      this.next = next;
      this.size = size;
      this.sealed = sealed;
    }

    /** The segment's file with another suffix: {@code 00000000000000000000.log} -> {@code ...0.index}. */
    Path sibling(String suffix) {
      String name = path.getFileName().toString();
      return path.resolveSibling(name.substring(0, name.length() - ".log".length()) + suffix);
    }

    /**
     * The segment's largest timestamp (ms) from the last entry of its {@code .timeindex} (12-byte entries:
     * int64 timestamp, uint32 relative offset, little-endian), or null: not sealed, or no usable index.
     */
    Long maxTimestampHint() {
      if (!sealed) {
        return null;
      }
      Path index = sibling(".timeindex");
      try (FileChannel ch = FileChannel.open(index, StandardOpenOption.READ)) {
        long size = ch.size();
        if (size < 12 || size % 12 != 0) {
          return null;
        }
        ByteBuffer entry = ByteBuffer.allocate(12).order(ByteOrder.LITTLE_ENDIAN);
        while (entry.hasRemaining()) {
          if (ch.read(entry, size - 12 + entry.position()) < 0) {
            return null;
          }
        }
        return entry.getLong(0);
      } catch (IOException e) {
        return null;
      }
    }
  }

  /** (log end offset, active base offset, active size); null when the state was never written. */
  private static final class State {
    final long end;
    final long activeBase;
    final long activeSize;
    final long epoch;

    State(long end, long activeBase, long activeSize, long epoch) {
      this.end = end;
      this.activeBase = activeBase;
      this.activeSize = activeSize;
      this.epoch = epoch;
    }

    boolean same(State o) {
      return o != null
          && end == o.end
          && activeBase == o.activeBase
          && activeSize == o.activeSize
          && epoch == o.epoch;
    }
  }

  final Path dir;
  final List<Segment> segments;

  PartitionFiles(String root, String topic, int partition) throws IOException {
    this.dir = Path.of(root, topic + "-" + partition);
    if (!Files.isDirectory(dir)) {
      throw new PylogReadException(PylogReadException.OTHER, "partition directory " + dir + " is missing", null);
    }
    this.segments = load();
  }

  long logStart() {
    return segments.get(0).base;
  }

  long logEnd() {
    return segments.get(segments.size() - 1).next;
  }

  /** Segments holding offsets in {@code [start, end)}, with published bytes. */
  List<Segment> segmentsFor(long start, long end) {
    List<Segment> out = new ArrayList<>();
    for (Segment s : segments) {
      if (s.base < end && s.next > start && s.size > 0) {
        out.add(s);
      }
    }
    return out;
  }

  private List<Segment> load() throws IOException {
    Path statePath = dir.resolve("partition.state");
    for (int i = 0; i < 100; i++) {
      State before = readState(statePath);
      List<Segment> listed = list(before);
      State after = readState(statePath);
      if (before == null ? after == null : before.same(after)) {
        return listed;
      }
    }
    throw new PylogReadException(PylogReadException.OTHER, dir + ": the segment layout keeps changing while listed", null);
  }

  private List<Segment> list(State state) throws IOException {
    List<Long> bases = new ArrayList<>();
    try (DirectoryStream<Path> names = Files.newDirectoryStream(dir)) {
      for (Path p : names) {
        Matcher m = SEGMENT.matcher(p.getFileName().toString());
        if (m.matches()) {
          long base = Long.parseLong(m.group(1));
          if (state == null || base <= state.activeBase) {
            bases.add(base);
          }
        }
      }
    }
    if (bases.isEmpty()) {
      throw new PylogReadException(dir + ": no segment files");
    }
    Collections.sort(bases);
    List<Segment> out = new ArrayList<>(bases.size());
    for (int i = 0; i < bases.size(); i++) {
      long base = bases.get(i);
      Path path = dir.resolve(String.format("%020d.log", base));
      boolean last = i == bases.size() - 1;
      if (last && state != null) {
        out.add(new Segment(path, base, state.end, state.activeSize, false));
        continue;
      }
      long size;
      try {
        size = Files.size(path);
      } catch (NoSuchFileException e) {
        size = 0;
      }
      long next = last ? scanEnd(path, base, size) : bases.get(i + 1);
      out.add(new Segment(path, base, next, size, !last));
    }
    return out;
  }

  /** The next offset of a segment whose end is not published (a log never opened by a writer). */
  private static long scanEnd(Path path, long base, long size) throws IOException {
    long next = base;
    if (size > 0) {
      ByteBuffer buf = map(path, size);
      int pos = 0;
      while (pos < size) {
        BatchDecoder.Header h = BatchDecoder.header(buf, pos, (int) size);
        next = h.baseOffset + h.lastOffsetDelta + 1;
        pos += h.batchLength;
      }
    }
    return next;
  }

  private static State readState(Path path) throws IOException {
    FileChannel ch;
    try {
      ch = FileChannel.open(path, StandardOpenOption.READ);
    } catch (NoSuchFileException e) {
      return null;
    }
    try (ch) {
      ByteBuffer raw = ByteBuffer.allocate(56).order(ByteOrder.LITTLE_ENDIAN);
      ByteBuffer seqAgain = ByteBuffer.allocate(8).order(ByteOrder.LITTLE_ENDIAN);
      for (int i = 0; i < 10_000; i++) {
        raw.clear();
        if (ch.read(raw, 0) < 56) {
          return null;
        }
        if (raw.getLong(0) != STATE_MAGIC) {
          return null;
        }
        long seq = raw.getLong(8);
        if ((seq & 1) != 0) {
          continue;
        }
        seqAgain.clear();
        ch.read(seqAgain, 8);
        if (seqAgain.getLong(0) == seq) {
          return new State(raw.getLong(16), raw.getLong(24), raw.getLong(32), raw.getLong(40));
        }
      }
    }
    throw new PylogReadException(path + ": a writer stays in the middle of publishing");
  }

  /** A read-only little-endian map of the first {@code size} bytes of {@code path}. */
  static MappedByteBuffer map(Path path, long size) throws IOException {
    try (FileChannel ch = FileChannel.open(path, StandardOpenOption.READ)) {
      MappedByteBuffer buf = ch.map(FileChannel.MapMode.READ_ONLY, 0, size);
      buf.order(ByteOrder.LITTLE_ENDIAN);
      return buf;
    }
  }

  /**
   * A byte position at or before the batch holding {@code offset}: the {@code .index} entry at or below it
   * when that entry points at a batch header carrying the entry's offset, else 0 (the index is only a hint).
   * The batch at a position above 0 has the base offset its entry names.
   */
  static int indexFloor(Segment seg, ByteBuffer buf, long offset) throws IOException {
    Path index = seg.sibling(".index");
    byte[] raw;
    try {
      raw = Files.readAllBytes(index);
    } catch (NoSuchFileException e) {
      return 0;
    }
    ByteBuffer entries = ByteBuffer.wrap(raw).order(ByteOrder.LITTLE_ENDIAN);
    long rel = offset - seg.base;
    int lo = 0;
    int hi = raw.length / 8; // entries [lo, hi): the last one with relative offset <= rel
    while (lo < hi) {
      int mid = (lo + hi) >>> 1;
      if (Integer.toUnsignedLong(entries.getInt(mid * 8)) <= rel) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    if (lo == 0) {
      return 0;
    }
    long entryRel = Integer.toUnsignedLong(entries.getInt((lo - 1) * 8));
    long entryPos = Integer.toUnsignedLong(entries.getInt((lo - 1) * 8 + 4));
    if (entryPos >= seg.size) {
      return 0;
    }
    try {
      BatchDecoder.Header h = BatchDecoder.header(buf, (int) entryPos, (int) seg.size);
      return h.baseOffset == seg.base + entryRel ? (int) entryPos : 0;
    } catch (PylogReadException e) {
      return 0;
    }
  }
}
