package pylog.spark.jvm;

import java.io.Serializable;
import org.apache.spark.sql.connector.read.InputPartition;

/** Offset ranges of one or more topic partitions, as the Python planner made them. */
final class NativePartition implements InputPartition {
  private static final long serialVersionUID = 1L;

  /**
   * Offsets {@code [start, end)} of {@code topic}-{@code partition}, but those in the {@code skipped}
   * ranges: {@code [skipped[2i], skipped[2i+1])}, sorted and disjoint, the batches of aborted transactions
   * and control batches a {@code read_committed} read leaves out. The Python planner computed them (and
   * ended the range at the last stable offset) with pylog's visibility rule, as Kafka's fetch response
   * carries the aborted transactions: this reader never reads the transaction log.
   *
   * <p>{@code dense}: the topic is not compacted, so each batch's base offset must be exactly the offset after
   * its predecessor's last one; otherwise (compacted, or a plan that does not say) it must only be greater,
   * as {@code pylog.partition.segment.Segment} checks them.
   */
  static final class Range implements Serializable {
    private static final long serialVersionUID = 2L;
    final String topic;
    final int partition;
    final long start;
    final long end;
    final long[] skipped;
    final boolean dense;

    Range(String topic, int partition, long start, long end, long[] skipped, boolean dense) {
      this.topic = topic;
      this.partition = partition;
      this.start = start;
      this.end = end;
      this.skipped = skipped;
      this.dense = dense;
    }

    /** Whether {@code offset} lies in a skipped range. */
    boolean skips(long offset) {
      int lo = 0;
      int hi = skipped.length / 2;
      while (lo < hi) {
        int mid = (lo + hi) >>> 1;
        if (skipped[2 * mid + 1] <= offset) {
          lo = mid + 1;
        } else {
          hi = mid;
        }
      }
      return lo < skipped.length / 2 && skipped[2 * lo] <= offset;
    }

    String describe() {
      return topic + "-" + partition + " offsets [" + start + ", " + end + ")";
    }
  }

  /**
   * The pushed timestamp filters, in microseconds since the epoch as Spark's column: {@code lo <= t <= hi}
   * (null: unbounded) and, when {@code values} is set, {@code t} one of them. Spark evaluates the filters
   * again row by row; the reader uses them only to skip segments and batches that cannot match.
   */
  static final class TimestampBounds implements Serializable {
    private static final long serialVersionUID = 1L;
    final Long lo;
    final Long hi;
    final long[] values;

    TimestampBounds(Long lo, Long hi, long[] values) {
      this.lo = lo;
      this.hi = hi;
      this.values = values;
    }

    /** Whether some timestamp in {@code [loMs, hiMs]} (milliseconds) may pass the filters. */
    boolean overlapsMillis(long loMs, long hiMs) {
      long a = loMs * 1000L;
      long b = hiMs * 1000L;
      if ((lo != null && b < lo) || (hi != null && a > hi)) {
        return false;
      }
      if (values == null) {
        return true;
      }
      for (long v : values) {
        if (a <= v && v <= b) {
          return true;
        }
      }
      return false;
    }
  }

  /** One pinned segment of a URL read (see {@code pylog.spark.remote.jvm_plan}). */
  static final class RemoteSeg implements Serializable {
    private static final long serialVersionUID = 1L;
    final long base;
    final long next;
    final long size;
    /** The manifest's largest timestamp (ms), or -1 when unknown. */
    final long maxTimestamp;
    final String key;
    /** The presigned GET URL of {@code key}; null for a {@code file://} store. */
    final String url;
    /** Null when the segment has no index object. */
    final String indexKey;
    final String indexUrl;
    final long indexSize;

    RemoteSeg(
        long base,
        long next,
        long size,
        long maxTimestamp,
        String key,
        String url,
        String indexKey,
        String indexUrl,
        long indexSize) {
      this.base = base;
      this.next = next;
      this.size = size;
      this.maxTimestamp = maxTimestamp;
      this.key = key;
      this.url = url;
      this.indexKey = indexKey;
      this.indexUrl = indexUrl;
      this.indexSize = indexSize;
    }
  }

  /**
   * The object store of a URL read and the segments the planner pinned for this task, by {@code
   * topic-partition}: read as files under {@code root} ({@code file://}), or through presigned URLs.
   */
  static final class RemotePlan implements Serializable {
    private static final long serialVersionUID = 1L;
    final String store;
    final String root;
    final long expirySeconds;
    final java.util.Map<String, RemoteSeg[]> segments;
    /**
     * By {@code topic-partition}: {@code [key, url, key, url, ...]} of manifest versions after the pinned one,
     * {@code KEEP_VERSIONS} apart (url null for a {@code file://} store); absent when unknown.
     */
    final java.util.Map<String, String[]> nextManifests;
    /**
     * A tiered log directory: by {@code topic-partition}, the local log start when the query was planned
     * (a range of a partition not here is read from its local files only); empty for a URL read.
     */
    final java.util.Map<String, Long> localStarts;
    /** Why the store cannot be read here when {@code store} is {@code "none"} (a tiered log directory). */
    final String reason;

    RemotePlan(
        String store,
        String root,
        long expirySeconds,
        java.util.Map<String, RemoteSeg[]> segments,
        java.util.Map<String, String[]> nextManifests,
        java.util.Map<String, Long> localStarts,
        String reason) {
      this.store = store;
      this.root = root;
      this.expirySeconds = expirySeconds;
      this.segments = segments;
      this.nextManifests = nextManifests;
      this.localStarts = localStarts;
      this.reason = reason;
    }

    boolean isFile() {
      return "file".equals(store);
    }

    /** Whether the objects can be read here at all ({@code file://} or presigned URLs). */
    boolean readable() {
      return "file".equals(store) || "signed".equals(store);
    }

    /** The local log start planned for a tiered partition, or null when it is not one. */
    Long localStart(String topic, int partition) {
      return localStarts.get(topic + "-" + partition);
    }

    RemoteSeg[] segments(String topic, int partition) {
      RemoteSeg[] segs = segments.get(topic + "-" + partition);
      return segs == null ? new RemoteSeg[0] : segs;
    }
  }

  final String path;
  final boolean failOnDataLoss;
  final Range[] ranges;
  /** Null when no timestamp filter was pushed. */
  final TimestampBounds timestamp;
  /** Null for a log directory without tiered partitions in this partition's plan. */
  final RemotePlan remote;

  NativePartition(String path, boolean failOnDataLoss, Range[] ranges, TimestampBounds timestamp) {
    this(path, failOnDataLoss, ranges, timestamp, null);
  }

  NativePartition(
      String path, boolean failOnDataLoss, Range[] ranges, TimestampBounds timestamp, RemotePlan remote) {
    this.path = path;
    this.failOnDataLoss = failOnDataLoss;
    this.ranges = ranges;
    this.timestamp = timestamp;
    this.remote = remote;
  }
}
