package chdb

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/dualflow/dualflow/internal/atomicfile"
)

// confineDir is the folder of a data directory (or of the temporary
// directory of an in-memory engine) holding the engine's configuration
// (written at every Open) and the empty directory its file paths point at.
const confineDir = "dualflow-engine"

// grants are the engine user's privileges: everything the product does
// (reads, inserts, migrations, materialized views and projections,
// OPTIMIZE, SYSTEM FLUSH, KILL QUERY of its own statements) and nothing
// that reaches outside the data directory. The engine runs every statement
// as its one user, "default", with every grant unless told otherwise, so
// without this list the table functions file, url, s3, remote, mysql,
// postgresql, hdfs, azureBlobStorage (the SOURCES grants), the File, URL and
// other source table engines (TABLE ENGINE), and BACKUP/RESTORE read and
// write files and reach the network for anyone whose statement reaches the
// engine. The engine refuses those now (ACCESS_DENIED, code 497), whoever
// asks, whatever a guard upstream missed.
//
// What a grant cannot stop, the paths below and sqlguard do: INTO OUTFILE
// is written by the embedded engine's client side (clickhouse-local), which
// checks no grant, so every path from users to the engine refuses it
// before the statement runs (sqlguard.Vet, and the ClickHouse HTTP
// interface for every user, as a ClickHouse server's does).
//
// The cluster form of the schema (--clickhouse.cluster) is tested on this
// engine, hence Distributed: its tables reach only the clusters of the
// engine's configuration.
var grants = []string{
	"GRANT SELECT, INSERT, ALTER, CREATE, DROP, TRUNCATE, OPTIMIZE, SHOW, KILL QUERY, SYSTEM ON *.*",
	"GRANT TABLE ENGINE ON Distributed",
}

// engineConfig is the configuration file the engine boots with: the users
// file with the grants above, and the directories the engine reads user
// files, scripts and format schemas from (executable(), dictionaries with a
// FILE source, format_schema) pointed at an empty directory of mode 0500.
// The embedded engine accepts absolute paths outside user_files_path in
// file() (it is clickhouse-local), which the grants stop; executable()
// scripts and DDL dictionaries with a FILE source stay inside these paths.
const engineConfig = `<clickhouse>
    <users_config>%[1]s</users_config>
    <user_files_path>%[2]s</user_files_path>
    <user_scripts_path>%[2]s</user_scripts_path>
    <format_schema_path>%[2]s</format_schema_path>
    <dictionaries_lib_path>%[2]s</dictionaries_lib_path>
%[3]s</clickhouse>
`

const engineUsers = `<clickhouse>
    <profiles><default></default></profiles>
    <quotas><default></default></quotas>
    <users>
        <default>
            <password></password>
            <networks><ip>::/0</ip></networks>
            <profile>default</profile>
            <quota>default</quota>
            <grants>%s</grants>
        </default>
    </users>
</clickhouse>
`

// writeConfinement writes the engine's configuration under dir (a data
// directory, or an in-memory engine's temporary directory), with extra
// (Config.ExtraConfig) inside its root element, and returns the connect
// argument that loads it. The files are rewritten at every Open, so they
// are always this build's.
func writeConfinement(dir, extra string) (string, error) {
	base := filepath.Join(dir, confineDir)
	empty := filepath.Join(base, "empty")
	if err := os.MkdirAll(empty, 0o700); err != nil {
		return "", fmt.Errorf("chdb: engine config: %w", err)
	}
	// Not writable, not even by its owner (root is not stopped by modes:
	// it is by the grants).
	if err := os.Chmod(empty, 0o500); err != nil {
		return "", fmt.Errorf("chdb: engine config: %w", err)
	}
	users := filepath.Join(base, "users.xml")
	config := filepath.Join(base, "config.xml")
	if err := writeAtomic(users, fmt.Sprintf(engineUsers, "<query>"+strings.Join(grants, "</query><query>")+"</query>")); err != nil {
		return "", err
	}
	if err := writeAtomic(config, fmt.Sprintf(engineConfig, users, empty+"/", extra)); err != nil {
		return "", err
	}
	return "--config-file=" + config, nil
}

func writeAtomic(path, content string) error {
	if err := atomicfile.Write(path, 0o600, func(w io.Writer) error { _, err := io.WriteString(w, content); return err }); err != nil {
		return fmt.Errorf("chdb: engine config %s: %w", path, err)
	}
	return nil
}
