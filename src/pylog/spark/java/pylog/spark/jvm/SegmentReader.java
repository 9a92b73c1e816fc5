package pylog.spark.jvm;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.NoSuchFileException;
import java.util.Iterator;
import java.util.List;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.execution.vectorized.OnHeapColumnVector;
import org.apache.spark.sql.execution.vectorized.WritableColumnVector;
import org.apache.spark.sql.types.StructField;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * Reads the offset ranges of a {@link NativePartition} from the mapped segment files into Spark column
 * vectors, {@value #ROWS} rows at a time, building only the columns of the (pruned) schema.
 *
 * <p>Same semantics as {@code pylog.spark.batches}: each range is checked against the partition's current
 * log start and end (data loss fails the task, or is skipped with {@code failOnDataLoss=false}); a segment
 * deleted by retention after planning is data loss too; every batch read is CRC-checked, every base offset
 * walked over is checked against its predecessor's ({@link #checkBase}), and a corrupt batch names the file
 * and position. With pushed timestamp filters, sealed segments whose time index ends before
 * them and batches whose header's timestamp span misses them are skipped without decoding (Spark applies
 * the filters to the rows). A {@code read_committed} range leaves out the batches its planner marked
 * skipped (see {@link NativePartition.Range}). A URL read reads the pinned remote segments ({@link
 * RemoteWalk}); a tiered log directory's partition reads below its local log start from the store and the
 * rest from its local files ({@link #openTieredRange}). Not thread-safe: one reader per task, as Spark uses
 * it.
 */
final class SegmentReader implements PartitionReader<ColumnarBatch> {
  private static final Logger LOG = LoggerFactory.getLogger(SegmentReader.class);

  static final int ROWS = 4096;

  private enum Role {
    KEY,
    VALUE,
    TOPIC,
    PARTITION,
    OFFSET,
    TIMESTAMP,
    TIMESTAMP_TYPE,
    HEADERS,
    /** A column of the msgpack values ({@code valueFormat=msgpack}). */
    VALUE_FIELD
  }

  private final NativePartition partition;
  private final Role[] roles;
  private final WritableColumnVector[] vectors;
  private final ColumnarBatch batch;
  private final BatchDecoder.Decoded decoded = new BatchDecoder.Decoded();
  private final Headers headers;
  private final MsgpackValues values;

  private int rangeIndex = -1;
  private NativePartition.Range range;
  private byte[] topicBytes;
  private long start;
  private long end;
  private Iterator<PartitionFiles.Segment> segments;
  private PartitionFiles.Segment segment;
  private ByteBuffer buf;
  private int pos;
  /**
   * The base offset the next batch of the current segment must have: exactly ({@link #exact}, or a dense
   * range), or at least (a compacted segment's batch after a gap its cleaning left).
   */
  private long expected;
  private boolean exact;
  private int cursor;
  private int hi;
  /** A URL read: the store's objects, the pinned segments left of the range, the current one's batches. */
  private final RemoteObjects objects;
  private Iterator<NativePartition.RemoteSeg> remoteSegs;
  private RemoteWalk walk;
  /**
   * A range of a tiered log directory's partition, in the order read: its offsets below the local log start
   * (from the pinned segments, then those uploaded since planning), then one piece per local segment.
   */
  private java.util.ArrayDeque<Piece> pieces;
  /** The local piece being read (its segment gone before it was mapped: read from the store instead). */
  private Piece localPiece;
  /** The partition's segments in the newest manifest, read once per range when needed. */
  private NativePartition.RemoteSeg[] newest;

  /** Offsets {@code [start, end)} of a tiered range: from the store ({@code local} null) or one local file. */
  private static final class Piece {
    final long start;
    final long end;
    /** The pinned segments to read them from; null: the segments of the newest manifest. */
    final NativePartition.RemoteSeg[] segs;
    final PartitionFiles.Segment local;

    Piece(long start, long end, NativePartition.RemoteSeg[] segs, PartitionFiles.Segment local) {
      this.start = start;
      this.end = end;
      this.segs = segs;
      this.local = local;
    }
  }

  SegmentReader(NativePartition partition, StructType schema) {
    this.partition = partition;
    this.objects = partition.remote == null ? null : new RemoteObjects(partition.remote);
    StructField[] fields = schema.fields();
    this.roles = new Role[fields.length];
    for (int i = 0; i < fields.length; i++) {
      roles[i] = role(fields[i].name());
    }
    this.vectors = OnHeapColumnVector.allocateColumns(ROWS, schema);
    this.batch = new ColumnarBatch(vectors);
    Headers h = null;
    for (int i = 0; i < roles.length; i++) {
      if (roles[i] == Role.HEADERS) {
        h = new Headers(vectors[i]);
      }
    }
    this.headers = h;
    java.util.List<StructField> valueFields = new java.util.ArrayList<>();
    java.util.List<WritableColumnVector> valueVectors = new java.util.ArrayList<>();
    for (int i = 0; i < roles.length; i++) {
      if (roles[i] == Role.VALUE_FIELD) {
        valueFields.add(fields[i]);
        valueVectors.add(vectors[i]);
      }
    }
    this.values =
        valueFields.isEmpty()
            ? null
            : new MsgpackValues(
                valueFields.toArray(new StructField[0]),
                valueVectors.toArray(new WritableColumnVector[0]));
  }

  private static Role role(String name) {
    switch (name) {
      case "key":
        return Role.KEY;
      case "value":
        return Role.VALUE;
      case "topic":
        return Role.TOPIC;
      case "partition":
        return Role.PARTITION;
      case "offset":
        return Role.OFFSET;
      case "timestamp":
        return Role.TIMESTAMP;
      case "timestampType":
        return Role.TIMESTAMP_TYPE;
      case "headers":
        return Role.HEADERS;
      default:
        return Role.VALUE_FIELD;
    }
  }

  @Override
  public boolean next() throws IOException {
    for (WritableColumnVector v : vectors) {
      v.reset();
    }
    if (headers != null) {
      headers.reset();
    }
    int rows = 0;
    while (rows < ROWS) {
      if (cursor < hi) {
        int take = Math.min(ROWS - rows, hi - cursor);
        fill(rows, take);
        rows += take;
        cursor += take;
      } else if (!nextBatch()) {
        break;
      }
    }
    batch.setNumRows(rows);
    return rows > 0;
  }

  @Override
  public ColumnarBatch get() {
    return batch;
  }

  @Override
  public void close() {
    batch.close();
  }

  private void fill(int row, int n) {
    BatchDecoder.Decoded d = decoded;
    int c = cursor;
    for (int j = 0; j < roles.length; j++) {
      WritableColumnVector v = vectors[j];
      switch (roles[j]) {
        case KEY:
          binary(v, row, n, d.keyPos, d.keyLen, c, d.data);
          break;
        case VALUE:
          binary(v, row, n, d.valuePos, d.valueLen, c, d.data);
          break;
        case TOPIC:
          for (int i = 0; i < n; i++) {
            v.putByteArray(row + i, topicBytes, 0, topicBytes.length);
          }
          break;
        case PARTITION:
          v.putInts(row, n, range.partition);
          break;
        case OFFSET:
          v.putLongs(row, n, d.offsets, c);
          break;
        case TIMESTAMP:
          for (int i = 0; i < n; i++) {
            v.putLong(row + i, d.timestamps[c + i] * 1000L);
          }
          break;
        case TIMESTAMP_TYPE:
          v.putInts(row, n, d.timestampType());
          break;
        case HEADERS:
          for (int i = 0; i < n; i++) {
            headers.put(row + i, d.data, d.headerPos[c + i], d.headerLen[c + i]);
          }
          break;
        case VALUE_FIELD:
          break; // all value columns at once, below
        default:
          throw new IllegalStateException();
      }
    }
    if (values != null) {
      for (int i = 0; i < n; i++) {
        values.put(row + i, d.data, d.valuePos[c + i], d.valueLen[c + i], range, d.offsets[c + i]);
      }
    }
  }

  private static void binary(
      WritableColumnVector v, int row, int n, int[] pos, int[] len, int c, ByteBuffer data) {
    for (int i = 0; i < n; i++) {
      int l = len[c + i];
      if (l < 0) {
        v.putNull(row + i);
      } else {
        v.putByteArray(row + i, data, pos[c + i], l);
      }
    }
  }

  /** Decode the next batch holding records of the current range; false when every range is read. */
  private boolean nextBatch() throws IOException {
    while (true) {
      if (walk != null) {
        BatchDecoder.Header h;
        try {
          h = walk.next();
        } catch (RemoteObjects.Gone gone) {
          segmentGone(walk.seg);
          walk = null;
          continue;
        }
        if (h == null) {
          walk = null;
          continue;
        }
        if (h.baseOffset >= end) {
          walk = null;
          remoteSegs = null; // later segments hold higher offsets still
          continue;
        }
        if (h.lastOffset() < start) {
          continue;
        }
        NativePartition.TimestampBounds ts = partition.timestamp;
        if (ts != null && !ts.overlapsMillis(h.baseTimestamp, h.maxTimestamp)) {
          continue;
        }
        if (range.skipped.length > 0 && range.skips(Math.max(h.baseOffset, start))) {
          continue; // read_committed: an aborted or control batch
        }
        decodeRemote(h.baseOffset);
        if (rowsInRange()) {
          return true;
        }
        continue;
      }
      if (remoteSegs != null && remoteSegs.hasNext()) {
        openRemoteSegment(remoteSegs.next());
        continue;
      }
      if (buf != null && pos < segment.size) {
        BatchDecoder.Header h = header(segment, buf, pos);
        checkBase(h);
        if (h.baseOffset >= end) {
          buf = null;
          segments = null; // later segments hold higher offsets still
          continue;
        }
        int at = pos;
        pos += h.batchLength;
        if (h.lastOffset() < start) {
          continue;
        }
        NativePartition.TimestampBounds ts = partition.timestamp;
        if (ts != null && !ts.overlapsMillis(h.baseTimestamp, h.maxTimestamp)) {
          continue;
        }
        if (range.skipped.length > 0 && range.skips(Math.max(h.baseOffset, start))) {
          continue; // read_committed: an aborted or control batch
        }
        decodeChecked(at);
        if (rowsInRange()) {
          return true;
        }
        continue;
      }
      buf = null;
      if (segments != null && segments.hasNext()) {
        openSegment(segments.next());
        continue;
      }
      if (pieces != null && !pieces.isEmpty()) {
        openPiece(pieces.poll());
        continue;
      }
      if (++rangeIndex >= partition.ranges.length) {
        return false;
      }
      openRange(partition.ranges[rangeIndex]);
    }
  }

  /** Point the cursor at the decoded batch's records in {@code [start, end)}; false when there are none. */
  private boolean rowsInRange() {
    int n = decoded.count;
    long[] offs = decoded.offsets;
    cursor = offs[0] >= start ? 0 : search(offs, n, start);
    hi = offs[n - 1] < end ? n : search(offs, n, end);
    return cursor < hi;
  }

  private void decodeRemote(long base) {
    try {
      BatchDecoder.decode(walk.buf, walk.at, walk.limit(), decoded);
    } catch (PylogReadException e) {
      throw new PylogReadException(
          "corrupt batch in remote segment " + walk.seg.key + " (batch base offset " + base + "): "
              + e.getMessage(),
          e);
    }
  }

  /**
   * A URL read: the part of the range its pinned segments hold (the rest was dropped from the store before
   * the task's manifest was pinned: data loss), and those segments, as {@code _check_pinned} of {@code
   * pylog.spark.remote} does.
   */
  private void openRemoteRange(NativePartition.Range r) {
    openRemoteRange(r, partition.remote.segments(r.topic, r.partition));
  }

  private void openRemoteRange(NativePartition.Range r, NativePartition.RemoteSeg[] segs) {
    if (start < end && !partition.remote.readable()) {
      throw notReadable(new Piece(start, end, segs, null));
    }
    long first = segs.length > 0 ? segs[0].base : end;
    long last = segs.length > 0 ? segs[segs.length - 1].next : end;
    if (start < first && start < end) {
      long stop = Math.min(first, end);
      if (partition.failOnDataLoss) {
        throw lost(r, "offsets " + start + ".." + (stop - 1) + " were dropped from the object store after "
            + "the query was planned (remote retention)");
      }
      skipping(r, start, stop, "were dropped from the object store");
      start = stop;
    }
    if (last < end) {
      long from = Math.max(last, start);
      if (partition.failOnDataLoss) {
        throw lost(r, "offsets " + from + ".." + (end - 1) + " are not in the remote manifest");
      }
      skipping(r, from, end, "are not in the remote manifest");
      end = from;
    }
    List<NativePartition.RemoteSeg> keep = new java.util.ArrayList<>();
    for (NativePartition.RemoteSeg s : segs) {
      if (s.base < end && s.next > start) {
        keep.add(s);
      }
    }
    remoteSegs = keep.iterator();
  }

  private void openRemoteSegment(NativePartition.RemoteSeg seg) {
    NativePartition.TimestampBounds ts = partition.timestamp;
    if (ts != null && seg.maxTimestamp >= 0 && !ts.overlapsMillis(Long.MIN_VALUE / 2000, seg.maxTimestamp)) {
      return; // every record is older than the filters allow
    }
    walk = new RemoteWalk(objects, seg, Math.max(start, seg.base));
  }

  /**
   * A pinned object that is not in the store when read: dropped by remote retention after planning (data
   * loss) when a manifest version after the pinned one exists (retention publishes one without the segment
   * before it deletes the segment); else it is missing while the newest manifest names it: a {@code
   * RemoteStorageError}, never skipped, as on the Python path.
   */
  private void segmentGone(NativePartition.RemoteSeg seg) throws IOException {
    String[] next = partition.remote.nextManifests.get(range.topic + "-" + range.partition);
    boolean newer = true; // unknown: as before the check existed
    if (next != null) {
      // versions after the pinned one, KEEP_VERSIONS apart: publishes keep only the newest KEEP_VERSIONS, so
      // one of these is present whenever a newer version was published (up to the probes' reach)
      newer = false;
      for (int j = 0; j + 1 < next.length && !newer; j += 2) {
        try {
          objects.read(next[j], next[j + 1], 0, 1);
          newer = true;
        } catch (RemoteObjects.Gone g) {
          // not this version: the next probe
        }
      }
    }
    if (!newer) {
      throw new PylogReadException(
          PylogReadException.REMOTE,
          "remote segment " + seg.key + " of " + range.describe() + " is missing from the object store, "
              + "though the newest manifest still names it (no manifest was published after the one this "
              + "query pinned)",
          null);
    }
    String what = "(segment " + seg.key + ") were dropped from the object store";
    if (partition.failOnDataLoss) {
      throw lost(range, "offsets " + seg.base + ".." + (seg.next - 1) + " " + what
          + " after the query was planned (remote retention)");
    }
    skipping(range, seg.base, seg.next, what);
  }

  /**
   * The base offset lies outside the CRC: each batch of a segment must continue the one before it, exactly
   * in a dense range, at or after it in a compacted one, and end before the segment's end offset, as {@code
   * pylog.partition.segment.Segment} checks; the indexed batch a walk starts from must carry its entry's
   * offset, and a dense segment's first batch the segment's base offset. A damaged base offset fails the
   * task; it never ends a read early or gives rows wrong offsets.
   */
  private void checkBase(BatchDecoder.Header h) {
    long base = h.baseOffset;
    if (base != expected && (exact || range.dense || base < expected)) {
      throw new PylogReadException(
          "corrupt batch in " + segment.path + " at position " + pos + ": batch has base offset " + base
              + ", expected " + (exact || range.dense ? "" : "at least ") + expected);
    }
    if (h.lastOffset() >= segment.next) {
      throw new PylogReadException(
          "corrupt batch in " + segment.path + " at position " + pos + ": batch has base offset " + base
              + " and last offset " + h.lastOffset() + ", past the segment's end offset " + segment.next);
    }
    expected = h.lastOffset() + 1;
    exact = false;
  }

  private void decodeChecked(int at) {
    try {
      BatchDecoder.decode(buf, at, (int) segment.size, decoded);
    } catch (PylogReadException e) {
      String where = "";
      try {
        where = " (batch base offset " + BatchDecoder.header(buf, at, (int) segment.size).baseOffset + ")";
      } catch (PylogReadException ignored) {
        // the header itself is bad: the message says so
      }
      throw new PylogReadException(
          "corrupt batch in " + segment.path + " at position " + at + where + ": " + e.getMessage(), e);
    }
  }

  /** First index in {@code offs[0, n)} whose offset is {@code >= target}. */
  private static int search(long[] offs, int n, long target) {
    int lo = 0;
    int hi = n;
    while (lo < hi) {
      int mid = (lo + hi) >>> 1;
      if (offs[mid] < target) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    return lo;
  }

  private void openRange(NativePartition.Range r) throws IOException {
    range = r;
    topicBytes = r.topic.getBytes(StandardCharsets.UTF_8);
    pieces = null;
    localPiece = null;
    newest = null;
    Long planned = partition.remote == null ? null : partition.remote.localStart(r.topic, r.partition);
    if (partition.remote != null && planned == null && partition.path.contains("://")) {
      start = r.start;
      end = r.end;
      openRemoteRange(r);
      return;
    }
    PartitionFiles view = new PartitionFiles(partition.path, r.topic, r.partition);
    start = r.start;
    end = r.end;
    if (planned != null && start < end) {
      openTieredRange(r, view, planned);
      return;
    }
    if (view.logStart() > start) {
      if (partition.failOnDataLoss) {
        throw lost(r, "offsets " + start + ".." + (view.logStart() - 1)
            + " were deleted (log now starts at " + view.logStart() + ")");
      }
      skipping(r, start, Math.min(view.logStart(), end), "were deleted");
      start = Math.min(view.logStart(), end);
    }
    if (view.logEnd() < end) {
      if (partition.failOnDataLoss) {
        throw lost(r, "the log was truncated to end at " + view.logEnd());
      }
      skipping(r, Math.max(view.logEnd(), start), end, "were truncated away");
      end = Math.max(view.logEnd(), start);
    }
    List<PartitionFiles.Segment> segs = view.segmentsFor(start, end);
    segments = segs.iterator();
  }

  /**
   * A range of a tiered log directory's partition, as {@code pylog.spark.reader._read_tiered} reads it: the
   * offsets below the local log start as it is now from the segments pinned at planning (up to their end;
   * offsets between that end and the local log start at planning were in neither place, and are read past
   * as the consumer does), those local at planning and deleted locally since from the newest manifest, the
   * rest one local segment at a time ({@link #openPiece}).
   */
  private void openTieredRange(NativePartition.Range r, PartitionFiles view, long planned) {
    if (view.logEnd() < end) {
      if (partition.failOnDataLoss) {
        throw lost(r, "the log was truncated to end at " + view.logEnd());
      }
      skipping(r, Math.max(view.logEnd(), start), end, "were truncated away");
      end = Math.max(view.logEnd(), start);
    }
    long cut = Math.min(Math.max(start, view.logStart()), end);
    NativePartition.RemoteSeg[] pinned = partition.remote.segments(r.topic, r.partition);
    long pinnedEnd = pinned.length > 0 ? pinned[pinned.length - 1].next : start;
    pieces = new java.util.ArrayDeque<>();
    if (start < Math.min(cut, pinnedEnd)) {
      pieces.add(new Piece(start, Math.min(cut, pinnedEnd), pinned, null));
    }
    long gone = Math.max(start, Math.max(pinnedEnd, planned)); // local at planning, deleted locally since
    if (gone < cut) {
      pieces.add(new Piece(gone, cut, null, null));
    }
    for (PartitionFiles.Segment seg : view.segments) {
      if (seg.base < end && seg.next > cut) {
        pieces.add(new Piece(Math.max(cut, seg.base), Math.min(seg.next, end), null, seg));
      }
    }
    start = end; // nothing of the range itself: its pieces are read one by one
  }

  private void openPiece(Piece p) throws IOException {
    start = p.start;
    end = p.end;
    localPiece = p.local == null ? null : p;
    if (p.local != null) {
      segments = java.util.List.of(p.local).iterator();
      return;
    }
    openRemoteRange(range, p.segs != null ? p.segs : storeSegments(p));
  }

  /**
   * The segments holding offsets of {@code p} that were local when the query was planned and are in the
   * store only now: the pinned ones and those the newest manifest names after them.
   */
  private NativePartition.RemoteSeg[] storeSegments(Piece p) throws IOException {
    NativePartition.RemotePlan plan = partition.remote;
    NativePartition.RemoteSeg[] pinned = plan.segments(range.topic, range.partition);
    long pinnedEnd = pinned.length > 0 ? pinned[pinned.length - 1].next : p.start;
    if (p.end <= pinnedEnd) {
      return pinned;
    }
    if (!plan.readable()) {
      throw notReadable(p);
    }
    if (!plan.isFile()) {
      throw new PylogReadException(
          PylogReadException.REMOTE,
          "offsets " + p.start + ".." + (p.end - 1) + " of " + range.describe() + " were uploaded to the "
              + "object store and deleted locally after the query was planned: pylog's JVM reader reads "
              + "only the objects presigned at planning. Re-run the query (a new plan signs them), or read "
              + "it on the Python path: spark.conf.set('spark.pylog.native.enabled', 'false')",
          null);
    }
    if (newest == null) {
      newest = RemoteManifests.newest(plan.root, range.topic, range.partition);
    }
    List<NativePartition.RemoteSeg> out = new java.util.ArrayList<>(java.util.Arrays.asList(pinned));
    for (NativePartition.RemoteSeg s : newest) {
      if (s.base >= pinnedEnd && s.base < p.end && s.next > p.start) {
        out.add(s);
      }
    }
    return out.toArray(new NativePartition.RemoteSeg[0]);
  }

  private PylogReadException notReadable(Piece p) {
    return new PylogReadException(
        PylogReadException.REMOTE,
        "offsets " + p.start + ".." + (p.end - 1) + " of " + range.describe() + " are in the object store, "
            + "which pylog's JVM reader cannot read: " + partition.remote.reason
            + "; spark.conf.set('spark.pylog.native.enabled', 'false') reads it on the Python path",
        null);
  }

  private void openSegment(PartitionFiles.Segment seg) throws IOException {
    segment = seg;
    NativePartition.TimestampBounds ts = partition.timestamp;
    Long hint = ts == null ? null : seg.maxTimestampHint();
    if (hint != null && !ts.overlapsMillis(Long.MIN_VALUE / 2000, hint)) {
      buf = null; // every record is older than the filters allow
      return;
    }
    try {
      buf = PartitionFiles.map(seg.path, seg.size);
    } catch (NoSuchFileException e) {
      if (localPiece != null) { // deleted by the local retention, after its upload: read from the store
        Piece p = localPiece;
        localPiece = null;
        buf = null;
        segments = null;
        openRemoteRange(range, storeSegments(new Piece(p.start, p.end, null, null)));
        return;
      }
      if (partition.failOnDataLoss) {
        throw lost(range, "segment " + seg.path + " was deleted while the query ran");
      }
      LOG.warn("data loss reading {}: segment {} was deleted while the query ran; failOnDataLoss=false, "
          + "so its records are skipped", range.describe(), seg.path);
      buf = null;
      return;
    }
    // from the indexed batch at or before the range's start; the walk skips the batches before it
    pos = seg.base < start ? PartitionFiles.indexFloor(seg, buf, start) : 0;
    expected = pos > 0 ? header(seg, buf, pos).baseOffset : seg.base;
    exact = pos > 0;
  }

  /** The header of the batch at {@code at}; one that fails its checks is an error naming the file. */
  private static BatchDecoder.Header header(PartitionFiles.Segment seg, ByteBuffer buf, int at) {
    try {
      return BatchDecoder.header(buf, at, (int) seg.size);
    } catch (PylogReadException e) {
      throw named(seg, e);
    }
  }

  private static PylogReadException named(PartitionFiles.Segment seg, PylogReadException e) {
    return new PylogReadException("corrupt batch in " + seg.path + ": " + e.getMessage(), e);
  }

  /** failOnDataLoss=false: offsets {@code [first, stop)} of a planned range are gone; say so, as Kafka's source does. */
  private static void skipping(NativePartition.Range r, long first, long stop, String what) {
    LOG.warn("data loss reading {}: offsets {}..{} {}; failOnDataLoss=false, so they are skipped. Some data may "
        + "have been lost: it was deleted by retention, or the log was truncated", r.describe(), first, stop - 1, what);
  }

  private static PylogReadException lost(NativePartition.Range r, String what) {
    return PylogReadException.dataLoss(
        "data loss reading " + r.describe() + ": " + what
            + ". Set failOnDataLoss=false to skip records that are gone.");
  }
}
