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

  final String path;
  final boolean failOnDataLoss;
  final Range[] ranges;

  NativePartition(String path, boolean failOnDataLoss, Range[] ranges) {
    this.path = path;
    this.failOnDataLoss = failOnDataLoss;
    this.ranges = ranges;
  }
}
