package store

import (
	"fmt"

	"github.com/dualflow/dualflow/collector/store/chhttp"
)

// HTTPInterface builds the ClickHouse HTTP interface of the embedded engine
// e as configured by c: address c.HTTPAddr, the users of c.HTTPUsersFile
// (created at first start with an admin and a reader user with random
// passwords, mode 0600; the creation is logged) and c.HTTPAnonymous. srv
// supplies the rest (Registerer, Logger, timeouts); its Addr, Engine,
// Users and Anonymous are overwritten. It does not listen: see
// chhttp.Server.Serve.
func (c Config) HTTPInterface(e *Embedded, srv chhttp.Config) (*chhttp.Server, error) {
	users, created, err := chhttp.LoadOrCreateUsers(c.HTTPUsersFile)
	if err != nil {
		return nil, fmt.Errorf("clickhouse http interface: %w", err)
	}
	anon, err := chhttp.ParseAccess(c.HTTPAnonymous)
	if err != nil {
		return nil, err
	}
	if created && srv.Logger != nil {
		srv.Logger.Info("created the users of the ClickHouse HTTP interface (mode 0600): dualflow sql reads it; curl -u reader:PASSWORD", "file", c.HTTPUsersFile,
			"users", chhttp.AdminUser+" (read-write), "+chhttp.ReaderUser+" (read-only), "+chhttp.InserterUser+" (insert into tables, for collectors)")
	}
	srv.Addr, srv.Engine, srv.Users, srv.Anonymous = c.HTTPAddr, e.DB(), users, anon
	return chhttp.New(srv)
}
