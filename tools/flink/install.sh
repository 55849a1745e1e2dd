#!/usr/bin/env bash
# Flink and Beam's Flink job server from the registries, once per machine, into a cache keyed by version:
#   $TIDAL_TOOLS_CACHE (default ~/.cache/tidal/tools)/flink-$FLINK_VERSION/{bin,conf,lib}
#   $TIDAL_TOOLS_CACHE/beam-flink-job-server-$BEAM_JAVA_VERSION.jar
# Flink's scripts and conf come from PyPI's apache-flink wheel, its jars (flink-dist, log4j) from the
# apache-flink-libraries sdist, both fetched without dependencies (PyFlink pins an older Beam); the
# job server is shaded from Maven Central modules (tools/flink/pom.xml). Prints the two paths.
# Usage: bash tools/flink/install.sh [--print]   (--print: only print where they go)
set -euo pipefail
FLINK_VERSION=1.19.3       # the Flink minor Beam's newest servable runner targets (beam-runners-flink-1.19)
BEAM_JAVA_VERSION=2.62.0   # the newest beam-runners-flink-1.19 Maven Central serves with all its dependencies
here="$(cd "$(dirname "$0")" && pwd)"
cache="${TIDAL_TOOLS_CACHE:-$HOME/.cache/tidal/tools}"
flink_home="$cache/flink-$FLINK_VERSION"
jar="$cache/beam-flink-job-server-$BEAM_JAVA_VERSION.jar"
if [[ "${1:-}" == "--print" ]]; then echo "FLINK_HOME=$flink_home"; echo "BEAM_FLINK_JOB_SERVER_JAR=$jar"; exit 0; fi
mkdir -p "$cache"
work="$(mktemp -d "$cache/.install.XXXXXX")"
trap 'rm -rf "$work"' EXIT

if [[ ! -f "$flink_home/.complete" ]]; then
  echo "tools: Flink $FLINK_VERSION from PyPI (apache-flink, apache-flink-libraries; no dependencies)" >&2
  python3 -m pip download --quiet --no-deps --no-binary apache-flink-libraries -d "$work/pypi" \
    "apache-flink==$FLINK_VERSION" "apache-flink-libraries==$FLINK_VERSION"
  (cd "$work" && python3 -m zipfile -e pypi/apache_flink-"$FLINK_VERSION"-*.whl wheel \
     && tar xzf pypi/apache-flink-libraries-"$FLINK_VERSION".tar.gz \
        "apache-flink-libraries-$FLINK_VERSION/deps/lib" "apache-flink-libraries-$FLINK_VERSION/deps/bin")
  rm -rf "$flink_home" && mkdir -p "$flink_home"
  cp -r "$work/wheel/pyflink/bin" "$work/wheel/pyflink/conf" "$flink_home/"
  cp -r "$work/apache-flink-libraries-$FLINK_VERSION/deps/lib" "$flink_home/lib"
  cp "$work/apache-flink-libraries-$FLINK_VERSION/deps/bin/"*.jar "$flink_home/bin/"  # bash-java-utils.jar: config.sh
  chmod +x "$flink_home"/bin/*.sh
  test -f "$flink_home/lib/flink-dist-$FLINK_VERSION.jar"
  touch "$flink_home/.complete"
fi

if [[ ! -f "$jar" ]]; then
  echo "tools: Beam $BEAM_JAVA_VERSION Flink job server, shaded from Maven Central (tools/flink/pom.xml)" >&2
  cp "$here/pom.xml" "$work/pom.xml"
  (cd "$work" && mvn --batch-mode --quiet -Dbeam.version="$BEAM_JAVA_VERSION" package)
  mv "$work/target/beam-flink-job-server-$BEAM_JAVA_VERSION.jar" "$jar.tmp"
  mv "$jar.tmp" "$jar"
fi
echo "FLINK_HOME=$flink_home"
echo "BEAM_FLINK_JOB_SERVER_JAR=$jar"
