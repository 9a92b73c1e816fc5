package pylog.spark.jvm;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.ArrayList;
import java.util.List;
import net.razorvine.pickle.Unpickler;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.execution.datasources.v2.python.PythonInputPartition;
import org.apache.spark.sql.types.StructType;

/**
 * The Python scan's planned partitions, read by {@link SegmentReader}.
 *
 * <p>Each partition the Python planner made pickles as {@code pylog.spark.reader._restore(plan, state)},
 * where {@code plan} is JSON: {@code {"path": str, "failOnDataLoss": bool, "ranges": [[topic, partition,
 * start, end, [[first, next], ...]], ...], "timestamp": {"lo", "hi", "values"}}} (the fifth item of a
 * range: the offsets a {@code read_committed} read skips, see {@link NativePartition.Range}; {@code
 * timestamp} only when a timestamp filter was pushed). This class reads that JSON; anything else (Spark's
 * stand-in when there is nothing to read) is an empty partition.
 */
final class NativeScan implements Scan, Batch {
  private static final ObjectMapper JSON = new ObjectMapper();

  static {
    Unpickler.registerConstructor("pylog.spark.reader", "_restore", args -> args[0]);
  }

  private final Scan python;
  private final StructType required;

  NativeScan(Scan python, StructType required) {
    this.python = python;
    this.required = required;
  }

  @Override
  public StructType readSchema() {
    return required;
  }

  @Override
  public String description() {
    return "(JVM reader)";
  }

  @Override
  public Batch toBatch() {
    return this;
  }

  @Override
  public InputPartition[] planInputPartitions() {
    InputPartition[] planned = python.toBatch().planInputPartitions();
    List<InputPartition> out = new ArrayList<>(planned.length);
    for (InputPartition p : planned) {
      out.add(decode(((PythonInputPartition) p).pickedPartition()));
    }
    return out.toArray(new InputPartition[0]);
  }

  @Override
  public PartitionReaderFactory createReaderFactory() {
    return new NativeReaderFactory(required);
  }

  private static NativePartition.TimestampBounds timestampBounds(JsonNode ts) {
    if (ts == null || ts.isNull()) {
      return null;
    }
    JsonNode lo = ts.get("lo");
    JsonNode hi = ts.get("hi");
    JsonNode values = ts.get("values");
    long[] vs = null;
    if (values != null && !values.isNull()) {
      vs = new long[values.size()];
      for (int i = 0; i < vs.length; i++) {
        vs[i] = values.get(i).asLong();
      }
    }
    return new NativePartition.TimestampBounds(
        lo == null || lo.isNull() ? null : lo.asLong(),
        hi == null || hi.isNull() ? null : hi.asLong(),
        vs);
  }

  static NativePartition decode(byte[] pickled) {
    Object restored;
    try {
      restored = new Unpickler().loads(pickled);
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
    if (!(restored instanceof String)) {
      return new NativePartition("", true, new NativePartition.Range[0], null);
    }
    try {
      JsonNode plan = JSON.readTree((String) restored);
      JsonNode ranges = plan.get("ranges");
      NativePartition.Range[] out = new NativePartition.Range[ranges.size()];
      for (int i = 0; i < out.length; i++) {
        JsonNode r = ranges.get(i);
        JsonNode skips = r.get(4);
        long[] skipped = new long[skips == null ? 0 : 2 * skips.size()];
        for (int j = 0; j < skipped.length / 2; j++) {
          skipped[2 * j] = skips.get(j).get(0).asLong();
          skipped[2 * j + 1] = skips.get(j).get(1).asLong();
        }
        out[i] =
            new NativePartition.Range(
                r.get(0).asText(), r.get(1).asInt(), r.get(2).asLong(), r.get(3).asLong(), skipped);
      }
      return new NativePartition(
          plan.get("path").asText(),
          plan.get("failOnDataLoss").asBoolean(),
          out,
          timestampBounds(plan.get("timestamp")));
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }
}
