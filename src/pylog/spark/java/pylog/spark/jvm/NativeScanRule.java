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
 * types {@link MsgpackValues} decodes. A path that is an object-store URL ({@code s3://...}, {@code
 * file://...}: a log in tiered storage) stays on the Python path, which reads the remote segments.
 */
public final class NativeScanRule extends Rule<LogicalPlan> {
  /** Runtime setting: false keeps every read on the Python path. */
  public static final String ENABLED = "spark.pylog.native.enabled";

  static final Set<String> COLUMNS =
      Set.of(
          "key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers");

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

  static boolean accepts(PythonTable table, CaseInsensitiveStringMap options) {
    if (!"pylog".equals(table.name().toLowerCase(Locale.ROOT))) {
      return false;
    }
    if (options.getOrDefault("path", "").contains("://")) {
      return false; // a log in an object store: the Python path reads it (this reader maps local files)
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
