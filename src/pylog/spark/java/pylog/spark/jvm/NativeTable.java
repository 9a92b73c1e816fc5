package pylog.spark.jvm;

import java.util.EnumSet;
import java.util.Set;
import org.apache.spark.sql.connector.catalog.Column;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.execution.datasources.v2.python.PythonTable;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/** A pylog table read in the JVM; planning (options, offsets, splits, filters) stays in Python. */
public final class NativeTable implements Table, SupportsRead {
  private final PythonTable python;

  public NativeTable(PythonTable python) {
    this.python = python;
  }

  @Override
  public String name() {
    return python.name();
  }

  @Override
  @SuppressWarnings("deprecation")
  public StructType schema() {
    return python.schema();
  }

  @Override
  public Column[] columns() {
    return python.columns();
  }

  @Override
  public Set<TableCapability> capabilities() {
    return EnumSet.of(TableCapability.BATCH_READ);
  }

  @Override
  public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
    return new NativeScanBuilder(python.newScanBuilder(options), schema());
  }
}
