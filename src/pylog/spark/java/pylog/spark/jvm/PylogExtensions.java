package pylog.spark.jvm;

import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.SparkSessionExtensions;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.catalyst.rules.Rule;
import scala.runtime.AbstractFunction1;
import scala.runtime.BoxedUnit;

/**
 * The value of {@code spark.sql.extensions} that installs pylog's JVM reader.
 *
 * <p>It adds one analyzer rule, {@link NativeScanRule}: batch reads of {@code format("pylog")} whose columns
 * the JVM reader can build are planned by pylog's Python data source as usual, then read by {@link
 * SegmentReader} in the executor's JVM, column by column, with Spark's column pruning. Everything else
 * (streaming, writes, msgpack value columns of nested types) stays on the Python path.
 */
public final class PylogExtensions extends AbstractFunction1<SparkSessionExtensions, BoxedUnit> {
  @Override
  public BoxedUnit apply(SparkSessionExtensions extensions) {
    extensions.injectPostHocResolutionRule(
        new AbstractFunction1<SparkSession, Rule<LogicalPlan>>() {
          @Override
          public Rule<LogicalPlan> apply(SparkSession session) {
            return new NativeScanRule(session);
          }
        });
    return BoxedUnit.UNIT;
  }
}
