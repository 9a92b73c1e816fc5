package pylog.spark.jvm;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
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
 * start, end, [[first, next], ...], dense], ...], "timestamp": {"lo", "hi", "values"}}} (the fifth item of
 * a range: the offsets a {@code read_committed} read skips; the sixth: whether its offsets have no gaps (the
 * topic is not compacted), false when absent; see {@link NativePartition.Range}; {@code timestamp} only when
 * a timestamp filter was pushed). This class reads that JSON; anything else (Spark's
 * stand-in when there is nothing to read) is an empty partition. For a URL read ({@code path} an
 * object-store URL) the store and the segments pinned for the partition come from the pickled state
 * ({@link PlanUnpickler}): the driver made them, presigned URLs included, when it planned the query. A log
 * directory with tiered topics ({@code "tiered": url} in the plan) finds its store, its pinned remote
 * segments and the local log starts at planning there too; a store the driver could not sign for is then
 * no error until a task needs an object from it (its local segments are read as before).
 */
final class NativeScan implements Scan, Batch {
  private static final ObjectMapper JSON = new ObjectMapper();

  static {
    Unpickler.registerConstructor("pylog.spark.reader", "_restore", args -> args);
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

  /** The store and pinned segments of a URL read (see {@code pylog.spark.remote.jvm_plan}). */
  static NativePartition.RemotePlan remotePlan(String url, byte[] state, boolean tiered)
      throws IOException {
    String text = state == null ? null : PlanUnpickler.find(state);
    if (text == null) {
      throw new PylogReadException(
          PylogReadException.OTHER,
          "the planned partitions of " + url + " carry no plan for pylog's JVM reader (is the pylog on the "
              + "driver older than its jar?)",
          null);
    }
    JsonNode plan = JSON.readTree(text);
    String store = plan.get("store").asText();
    if (!tiered && !"file".equals(store) && !"signed".equals(store)) {
      throw new PylogReadException(
          PylogReadException.OTHER,
          "pylog's JVM reader cannot read " + url + ": " + plan.get("reason").asText()
              + "; spark.conf.set('spark.pylog.native.enabled', 'false') reads it on the Python path",
          null);
    }
    Map<String, NativePartition.RemoteSeg[]> byPartition = new HashMap<>();
    Map<String, String[]> nextManifests = new HashMap<>();
    for (JsonNode tp : plan.get("segments")) {
      JsonNode probes = tp.get(3); // [[key, url], ...]: manifest versions after the pinned one
      if (probes != null && probes.isArray() && probes.size() > 0) {
        String[] flat = new String[probes.size() * 2]; // key, url, key, url, ...
        for (int j = 0; j < probes.size(); j++) {
          flat[2 * j] = text(probes.get(j).get(0));
          flat[2 * j + 1] = text(probes.get(j).get(1));
        }
        nextManifests.put(tp.get(0).asText() + "-" + tp.get(1).asInt(), flat);
      }
      JsonNode segs = tp.get(2);
      NativePartition.RemoteSeg[] out = new NativePartition.RemoteSeg[segs.size()];
      for (int i = 0; i < out.length; i++) {
        JsonNode s = segs.get(i);
        out[i] =
            new NativePartition.RemoteSeg(
                s.get(0).asLong(),
                s.get(1).asLong(),
                s.get(2).asLong(),
                s.get(3).asLong(),
                s.get(4).asText(),
                text(s.get(5)),
                text(s.get(6)),
                text(s.get(7)),
                s.get(8).asLong());
      }
      byPartition.put(tp.get(0).asText() + "-" + tp.get(1).asInt(), out);
    }
    Map<String, Long> localStarts = new HashMap<>();
    JsonNode starts = plan.get("localStarts");
    if (starts != null) {
      for (JsonNode tp : starts) {
        localStarts.put(tp.get(0).asText() + "-" + tp.get(1).asInt(), tp.get(2).asLong());
      }
    }
    return new NativePartition.RemotePlan(
        store,
        plan.get("root").asText(),
        plan.get("expirySeconds").asLong(),
        byPartition,
        nextManifests,
        localStarts,
        text(plan.get("reason")));
  }

  private static String text(JsonNode n) {
    return n == null || n.isNull() ? null : n.asText();
  }

  static NativePartition decode(byte[] pickled) {
    Object restored;
    try {
      restored = new Unpickler().loads(pickled);
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
    if (!(restored instanceof Object[]) || !(((Object[]) restored)[0] instanceof String)) {
      return new NativePartition("", true, new NativePartition.Range[0], null);
    }
    Object[] args = (Object[]) restored;
    try {
      JsonNode plan = JSON.readTree((String) args[0]);
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
        JsonNode dense = r.get(5); // absent from older plans: the check that holds for every log
        out[i] =
            new NativePartition.Range(
                r.get(0).asText(),
                r.get(1).asInt(),
                r.get(2).asLong(),
                r.get(3).asLong(),
                skipped,
                dense != null && dense.asBoolean(false));
      }
      String path = plan.get("path").asText();
      NativePartition.RemotePlan remote = null;
      byte[] state = args.length > 1 && args[1] instanceof byte[] ? (byte[]) args[1] : null;
      if (path.contains("://")) { // a URL read: the pinned segments are in the pickled state
        remote = remotePlan(path, state, false);
      } else if (plan.hasNonNull("tiered")) { // a tiered log directory: its remote segments too
        remote = remotePlan(plan.get("tiered").asText(), state, true);
      }
      return new NativePartition(
          path,
          plan.get("failOnDataLoss").asBoolean(),
          out,
          timestampBounds(plan.get("timestamp")),
          remote);
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }
}
