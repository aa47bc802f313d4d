package chdb

// The calls into libchdb through purego (the functions lib.go loads): a
// connection, a statement and its result, a streaming insert, and the C
// strings and buffers they take.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"
	"time"
	"unsafe"
)

// connectArgs calls chdb_connect with args after a program name; nil on
// failure.
func (l *lib) connectArgs(args []string) *uintptr {
	argv := make([]*byte, 0, len(args)+2)
	keep := make([][]byte, 0, len(args)+1)
	for _, a := range append([]string{"clickhouse"}, args...) {
		b := append([]byte(a), 0)
		keep = append(keep, b)
		argv = append(argv, &b[0])
	}
	argv = append(argv, nil) // argv[argc] == NULL, as for main()
	h := l.connect(int32(len(keep)), argv)
	runtime.KeepAlive(keep)
	if h == nil || *h == 0 {
		return nil
	}
	return h
}

// run executes one statement on connection h and frees the engine's result.
func (l *lib) run(h uintptr, st Statement) (*Result, error) {
	q, f := []byte(st.Query), []byte(cmp.Or(st.Format, "TabSeparated"))
	var res uintptr
	if len(st.Params) == 0 {
		res = l.queryN(h, bytePtr(q), uintptr(len(q)), bytePtr(f), uintptr(len(f)))
	} else {
		n := len(st.Params)
		names, values := make([]*byte, 0, n), make([]*byte, 0, n)
		nameLens, valueLens := make([]uintptr, 0, n), make([]uintptr, 0, n)
		keep := make([][]byte, 0, 2*n)
		for k, v := range st.Params {
			kb, vb := append([]byte(k), 0), append([]byte(v), 0)
			keep = append(keep, kb, vb)
			names, nameLens = append(names, &kb[0]), append(nameLens, uintptr(len(k)))
			values, valueLens = append(values, &vb[0]), append(valueLens, uintptr(len(v)))
		}
		res = l.queryWithParamsN(h, bytePtr(q), uintptr(len(q)), bytePtr(f), uintptr(len(f)),
			names, nameLens, values, valueLens, uintptr(n))
		runtime.KeepAlive(keep)
	}
	runtime.KeepAlive(q)
	runtime.KeepAlive(f)
	return l.takeResult(res)
}

// takeResult copies a chdb_result into Go memory and destroys it.
func (l *lib) takeResult(res uintptr) (*Result, error) {
	if res == 0 {
		return nil, &Error{Message: "engine returned no result"}
	}
	defer l.destroyQueryResult(res)
	if msg := cString(l.resultError(res)); msg != "" {
		return nil, parseError(msg)
	}
	out := &Result{Stats: Stats{
		RowsRead:     l.resultRowsRead(res),
		BytesRead:    l.resultBytesRead(res),
		RowsWritten:  l.resultRowsWritten(res),
		BytesWritten: l.resultBytesWritten(res),
		Elapsed:      time.Duration(l.resultElapsed(res) * float64(time.Second)),
	}}
	if n := l.resultLength(res); n > 0 {
		if buf := l.resultBuffer(res); buf != nil {
			out.Data = make([]byte, n)
			copy(out.Data, unsafe.Slice(buf, n))
		}
	}
	return out, nil
}

// insert streams data into an INSERT (without FORMAT clause) on h.
func (l *lib) insert(ctx context.Context, h uintptr, query, format string, data io.Reader) (Stats, error) {
	q, f := []byte(query), []byte(format)
	s := l.streamInsertN(h, bytePtr(q), uintptr(len(q)), bytePtr(f), uintptr(len(f)))
	runtime.KeepAlive(q)
	runtime.KeepAlive(f)
	if s == 0 {
		return Stats{}, &Error{Message: "engine returned no insert stream"}
	}
	defer l.destroyInsertStream(s)
	if msg := cString(l.streamInsertError(s)); msg != "" {
		return Stats{}, parseError(msg)
	}
	if bufs, ok := data.(*Buffers); ok {
		// Hand the caller's buffers to the engine as they are: it copies
		// what it is given, so one copy is saved.
	send:
		for _, p := range *bufs {
			for len(p) > 0 {
				if err := ctx.Err(); err != nil {
					l.streamCancelInsert(s)
					return Stats{}, err
				}
				n := min(len(p), insertChunk)
				if l.streamAppend(s, &p[0], uintptr(n)) != 0 {
					if msg := cString(l.streamInsertError(s)); msg != "" {
						return Stats{}, parseError(msg)
					}
					// The engine reports the failure when the stream is finished.
					break send
				}
				p = p[n:]
			}
		}
		*bufs = nil
		res, err := l.takeResult(l.streamDone(s))
		if err != nil {
			return Stats{}, err
		}
		return res.Stats, nil
	}
	buf := chunkPool.Get().(*[]byte)
	defer chunkPool.Put(buf)
	for {
		if err := ctx.Err(); err != nil {
			l.streamCancelInsert(s)
			return Stats{}, err
		}
		n, rerr := io.ReadFull(data, *buf)
		if n > 0 {
			if l.streamAppend(s, &(*buf)[0], uintptr(n)) != 0 {
				msg := cString(l.streamInsertError(s))
				if msg == "" {
					// The engine reports the failure when the stream is finished.
					break
				}
				return Stats{}, parseError(msg)
			}
		}
		if rerr == io.EOF || errors.Is(rerr, io.ErrUnexpectedEOF) {
			break
		}
		if rerr != nil {
			l.streamCancelInsert(s)
			return Stats{}, fmt.Errorf("chdb: insert: read data: %w", rerr)
		}
	}
	res, err := l.takeResult(l.streamDone(s))
	if err != nil {
		return Stats{}, err
	}
	return res.Stats, nil
}

var chunkPool = sync.Pool{New: func() any {
	b := make([]byte, insertChunk)
	return &b
}}

// zero backs empty strings passed to the engine.
var zero = [1]byte{}

func bytePtr(b []byte) *byte {
	if len(b) == 0 {
		return &zero[0]
	}
	return &b[0]
}

// cString copies a NUL-terminated C string; "" for NULL.
func cString(p *byte) string {
	if p == nil {
		return ""
	}
	n := 0
	for *(*byte)(unsafe.Add(unsafe.Pointer(p), n)) != 0 {
		n++
	}
	return string(unsafe.Slice(p, n))
}
