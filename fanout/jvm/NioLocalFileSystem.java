package fanout.hadoop;

import org.apache.hadoop.fs.LocalFileSystem;

/**
 * Hadoop's checksummed local file system (the {@code file:} scheme's default) over
 * {@link NioRawLocalFileSystem}: the same files and checksum files, no {@code chmod}
 * processes. Set as {@code spark.hadoop.fs.file.impl} by fanout.spark.local_session.
 */
public class NioLocalFileSystem extends LocalFileSystem {
  public NioLocalFileSystem() {
    super(new NioRawLocalFileSystem());
  }
}
