package pylog.spark.jvm;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/** Columnar readers only: Spark consumes the column vectors directly. */
final class NativeReaderFactory implements PartitionReaderFactory {
  private static final long serialVersionUID = 1L;
  private final StructType schema;

  NativeReaderFactory(StructType schema) {
    this.schema = schema;
  }

  @Override
  public boolean supportColumnarReads(InputPartition partition) {
    return true;
  }

  @Override
  public PartitionReader<InternalRow> createReader(InputPartition partition) {
    throw new UnsupportedOperationException("the pylog JVM reader is columnar only");
  }

  @Override
  public PartitionReader<ColumnarBatch> createColumnarReader(InputPartition partition) {
    return new SegmentReader((NativePartition) partition, schema);
  }
}
