package pylog.spark.jvm;

import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.SupportsPushDownFilters;
import org.apache.spark.sql.connector.read.SupportsPushDownRequiredColumns;
import org.apache.spark.sql.sources.Filter;
import org.apache.spark.sql.types.StructType;

/**
 * Column pruning, and filters handed to the Python planner.
 *
 * <p>Filters the Python data source accepts narrow the planned offset ranges there; all of them are still
 * returned to Spark, which evaluates them on the rows read, so the JVM reader never filters records.
 */
final class NativeScanBuilder
    implements ScanBuilder, SupportsPushDownRequiredColumns, SupportsPushDownFilters {
  private final ScanBuilder python;
  private StructType required;

  NativeScanBuilder(ScanBuilder python, StructType schema) {
    this.python = python;
    this.required = schema;
  }

  @Override
  public void pruneColumns(StructType requiredSchema) {
    this.required = requiredSchema;
  }

  @Override
  public Filter[] pushFilters(Filter[] filters) {
    if (python instanceof SupportsPushDownFilters) {
      ((SupportsPushDownFilters) python).pushFilters(filters);
    }
    return filters;
  }

  @Override
  public Filter[] pushedFilters() {
    if (python instanceof SupportsPushDownFilters) {
      return ((SupportsPushDownFilters) python).pushedFilters();
    }
    return new Filter[0];
  }

  @Override
  public Scan build() {
    return new NativeScan(python.build(), required);
  }
}
