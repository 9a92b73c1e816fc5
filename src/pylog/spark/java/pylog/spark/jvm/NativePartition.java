package pylog.spark.jvm;

import java.io.Serializable;
import org.apache.spark.sql.connector.read.InputPartition;

/** Offset ranges of one or more topic partitions, as the Python planner made them. */
final class NativePartition implements InputPartition {
  private static final long serialVersionUID = 1L;

  /** Offsets {@code [start, end)} of {@code topic}-{@code partition}. */
  static final class Range implements Serializable {
    private static final long serialVersionUID = 1L;
    final String topic;
    final int partition;
    final long start;
    final long end;

    Range(String topic, int partition, long start, long end) {
      this.topic = topic;
      this.partition = partition;
      this.start = start;
      this.end = end;
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

  final String path;
  final boolean failOnDataLoss;
  final Range[] ranges;
  /** Null when no timestamp filter was pushed. */
  final TimestampBounds timestamp;

  NativePartition(String path, boolean failOnDataLoss, Range[] ranges, TimestampBounds timestamp) {
    this.path = path;
    this.failOnDataLoss = failOnDataLoss;
    this.ranges = ranges;
    this.timestamp = timestamp;
  }
}
