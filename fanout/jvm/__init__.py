"""JVM classes fanout adds to the Spark sessions it starts (``fanout.spark.local_session``).

They ship as Java source (``*.java`` here) and are compiled on first use by Janino, the
compiler Spark itself ships for its generated code: a JRE is enough, and no compiled file
lives in the repository or the wheel (:mod:`fanout.jvm.classes`).
"""
