package pylog.spark.jvm;

import java.util.Locale;
import java.util.Set;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.catalyst.rules.Rule;
import org.apache.spark.sql.execution.datasources.v2.DataSourceV2Relation;
import org.apache.spark.sql.execution.datasources.v2.python.PythonTable;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import scala.runtime.AbstractFunction1;

/**
 * Swaps the Python table of a batch {@code format("pylog")} read for a {@link NativeTable} over it.
 *
 * <p>Only relations in read position are visited (a write command's target is not a child of the plan).
 * The swap happens when the runtime setting {@value #ENABLED} is true (the default) and the query asks
 * for Kafka columns (headers included) and, with {@code valueFormat=msgpack}, value columns of the scalar
 * types {@link MsgpackValues} decodes. A path that is an object-store URL (a log in tiered storage) is
 * read here too when it is a {@code file://} store or an {@code s3://} store with signed requests ({@link
 * #readsStore}); other stores stay on the Python path. So does a log directory that records such a store
 * for its tiered topics ({@link #recordedStore}): its remote segments are read from that store.
 */
public final class NativeScanRule extends Rule<LogicalPlan> {
  /** Runtime setting: false keeps every read on the Python path. */
  public static final String ENABLED = "spark.pylog.native.enabled";

  static final Set<String> COLUMNS =
      Set.of(
          "key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers");

  /** URL schemes of the stores this reader reads (see {@link #readsStore}). */
  static final Set<String> STORES = Set.of("file", "s3", "s3a");

  private final SparkSession session;

  public NativeScanRule(SparkSession session) {
    this.session = session;
  }

  @Override
  public LogicalPlan apply(LogicalPlan plan) {
    if (!"true".equalsIgnoreCase(session.conf().get(ENABLED, "true"))) {
      return plan;
    }
    return rewrite(plan);
  }

  private LogicalPlan rewrite(LogicalPlan plan) {
    if (plan instanceof DataSourceV2Relation) {
      DataSourceV2Relation r = (DataSourceV2Relation) plan;
      if (r.table() instanceof PythonTable && accepts((PythonTable) r.table(), r.options())) {
        return r.copy(
            new NativeTable((PythonTable) r.table()),
            r.output(),
            r.catalog(),
            r.identifier(),
            r.options(),
            r.timeTravelSpec());
      }
      return plan;
    }
    return plan.mapChildren(
        new AbstractFunction1<LogicalPlan, LogicalPlan>() {
          @Override
          public LogicalPlan apply(LogicalPlan child) {
            return rewrite(child);
          }
        });
  }

  /**
   * Whether this reader reads the log in the object store at {@code url}: a {@code file://} store, or an
   * {@code s3://} one whose requests are signed (the driver presigns the objects each task reads). Other
   * schemes, and a store read without signatures ({@code skip_signature}), stay on the Python path.
   */
  static boolean readsStore(String url, CaseInsensitiveStringMap options) {
    String scheme = url.substring(0, url.indexOf("://")).toLowerCase(Locale.ROOT);
    if (!STORES.contains(scheme)) {
      return false;
    }
    for (String key : options.keySet()) {
      String k = key.toLowerCase(Locale.ROOT);
      if (k.startsWith("remotestorage.")
          && k.endsWith("skip_signature")
          && "true".equalsIgnoreCase(options.get(key).trim())) {
        return false;
      }
    }
    return true;
  }

  /**
   * The object store URL a log directory records in its {@code remote_storage} file (see {@code
   * pylog.tiered.location}: a header line, then JSON {@code {"remote_storage": url}}), or null when it
   * records none (or the file cannot be read: the planner then reports what is wrong).
   */
  static String recordedStore(String dir) {
    byte[] raw;
    try {
      raw = java.nio.file.Files.readAllBytes(java.nio.file.Path.of(dir, "remote_storage"));
    } catch (java.io.IOException | RuntimeException e) {
      return null;
    }
    String text = new String(raw, java.nio.charset.StandardCharsets.UTF_8);
    int nl = text.indexOf('\n');
    try {
      com.fasterxml.jackson.databind.JsonNode body =
          new com.fasterxml.jackson.databind.ObjectMapper().readTree(text.substring(nl + 1));
      com.fasterxml.jackson.databind.JsonNode url = body.get("remote_storage");
      return url != null && url.isTextual() && url.asText().contains("://") ? url.asText() : null;
    } catch (java.io.IOException | RuntimeException e) {
      return null;
    }
  }

  static boolean accepts(PythonTable table, CaseInsensitiveStringMap options) {
    if (!"pylog".equals(table.name().toLowerCase(Locale.ROOT))) {
      return false;
    }
    String path = options.getOrDefault("path", "");
    if (path.contains("://") && !readsStore(path, options)) {
      return false;
    }
    String tiered = path.contains("://") || path.isEmpty() ? null : recordedStore(path);
    if (tiered != null && !readsStore(tiered, options)) {
      return false; // a log directory tiering to a store read on the Python path only
    }
    boolean msgpack = "msgpack".equalsIgnoreCase(options.getOrDefault("valueFormat", "binary"));
    for (StructField f : table.schema().fields()) {
      if (!COLUMNS.contains(f.name()) && !(msgpack && MsgpackValues.supports(f.dataType()))) {
        return false;
      }
    }
    return true;
  }
}
