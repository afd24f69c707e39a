package fanout.hadoop;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;
import org.apache.hadoop.io.nativeio.NativeIO;

/**
 * Hadoop's raw local file system, setting a file's permission through java.nio.
 *
 * <p>Without Hadoop's native library (pyspark ships none), RawLocalFileSystem runs a
 * {@code chmod} process for every file it creates and every permission it sets. This class
 * changes that one call: the same permission bits, set by the JVM itself. With the native
 * library, a sticky bit, or a file system without POSIX permissions, Hadoop's own call runs.
 *
 * <p>Compiled by fanout from this source with Janino (fanout/jvm/classes.py).
 */
public class NioRawLocalFileSystem extends RawLocalFileSystem {
  public void setPermission(Path p, FsPermission permission) throws IOException {
    if (NativeIO.isAvailable() || permission.getStickyBit()) {
      super.setPermission(p, permission);
      return;
    }
    int mode = permission.toShort();
    EnumSet perms = EnumSet.noneOf(PosixFilePermission.class);
    if ((mode & 0400) != 0) perms.add(PosixFilePermission.OWNER_READ);
    if ((mode & 0200) != 0) perms.add(PosixFilePermission.OWNER_WRITE);
    if ((mode & 0100) != 0) perms.add(PosixFilePermission.OWNER_EXECUTE);
    if ((mode & 040) != 0) perms.add(PosixFilePermission.GROUP_READ);
    if ((mode & 020) != 0) perms.add(PosixFilePermission.GROUP_WRITE);
    if ((mode & 010) != 0) perms.add(PosixFilePermission.GROUP_EXECUTE);
    if ((mode & 04) != 0) perms.add(PosixFilePermission.OTHERS_READ);
    if ((mode & 02) != 0) perms.add(PosixFilePermission.OTHERS_WRITE);
    if ((mode & 01) != 0) perms.add(PosixFilePermission.OTHERS_EXECUTE);
    try {
      Files.setPosixFilePermissions(pathToFile(p).toPath(), perms);
    } catch (UnsupportedOperationException notPosix) {
      super.setPermission(p, permission);
    }
  }
}
