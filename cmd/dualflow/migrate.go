package main

import (
	"context"
	"fmt"
	"os"

	"github.com/dualflow/dualflow/collector/store"
	"github.com/dualflow/dualflow/migrations"
)

func runMigrate(ctx context.Context, args []string) error {
	fs := newFlagSet("migrate", "[flags]", `Apply the versioned ClickHouse schema (migrations/) to the embedded store
or to a ClickHouse server. Applied versions are recorded in
<database>.schema_migrations; running it again is a no-op. The collector
also migrates at start.

  dualflow migrate                                  # embedded store in var/data
  dualflow migrate --clickhouse.dsn clickhouse://ch:9000/
  dualflow migrate --print --clickhouse.cluster flows   # show the cluster DDL, apply nothing
  dualflow migrate --status`)
	var cfg store.Config
	cfg.TTLDays = 30
	cfg.BindFlags(fs)
	printSQL := fs.Bool("print", false, "print the rendered SQL (single node, or cluster with --clickhouse.cluster) and exit")
	status := fs.Bool("status", false, "list applied and pending migrations and exit")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return err
	}
	if *printSQL {
		sql, err := migrations.RenderAll(cfg.Migrations())
		if err != nil {
			return err
		}
		_, err = os.Stdout.WriteString(sql)
		return err
	}
	conn, err := store.Open(cfg)
	if err != nil {
		return err
	}
	defer conn.Close()
	r, err := migrations.NewRunner(conn, cfg.Migrations())
	if err != nil {
		return err
	}
	r.Version = version
	if *status {
		applied, err := r.Status(ctx)
		if err != nil {
			return err
		}
		pending, err := r.Pending(ctx)
		if err != nil {
			return err
		}
		for _, a := range applied {
			fmt.Printf("applied  %04d  %s  %.12s\n", a.Version, a.Name, a.Checksum)
		}
		for _, m := range pending {
			fmt.Printf("pending  %04d  %s  %.12s\n", m.Version, m.Name, m.Checksum)
		}
		return nil
	}
	done, err := r.Up(ctx)
	for _, m := range done {
		fmt.Printf("applied %s\n", m.Name)
	}
	if err != nil {
		return err
	}
	if len(done) == 0 {
		fmt.Println("schema is up to date")
	}
	return nil
}
