package chhttp

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"time"

	chproto "github.com/ClickHouse/ch-go/proto"
	"github.com/ClickHouse/clickhouse-go/v2/lib/column"
	"github.com/ClickHouse/clickhouse-go/v2/lib/proto"
)

// nativeBufSize is the read buffer for re-encoding; it must be at least
// ch-go's default so proto.NewReader uses our bufio.Reader as is, which lets
// reencodeNative peek for the end of the data between blocks.
const nativeBufSize = 1 << 20

// reencodeNative rewrites Native output of the engine (protocol revision 0:
// no BlockInfo, no serialization flags) for a client that sent
// client_protocol_version=revision, as a ClickHouse server would write it.
// It uses clickhouse-go's own column codecs, so every type the driver can
// read round-trips.
func reencodeNative(data []byte, revision uint64) ([]byte, error) {
	if revision == 0 || len(data) == 0 {
		return data, nil
	}
	br := bufio.NewReaderSize(bytes.NewReader(data), nativeBufSize)
	rd := chproto.NewReader(br)
	sc := column.ServerContext{Revision: revision, Timezone: time.UTC}
	out := &chproto.Buffer{Buf: make([]byte, 0, len(data)+len(data)/16+64)}
	for {
		if _, err := br.Peek(1); errors.Is(err, io.EOF) {
			return out.Buf, nil
		}
		block := proto.Block{ServerContext: &sc}
		if err := block.Decode(rd, 0); err != nil {
			return nil, fmt.Errorf("re-encode Native output: decode block: %w", err)
		}
		if err := block.Encode(out, revision); err != nil {
			return nil, fmt.Errorf("re-encode Native output: encode block: %w", err)
		}
	}
}
