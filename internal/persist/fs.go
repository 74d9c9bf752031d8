package persist

import (
	"errors"
	"fmt"
	iofs "io/fs"
	"os"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// failFS is the file system the store opens Pebble with: the real one, except
// that the first failed write of a file Pebble writes — a full disk, a
// file-size limit, an I/O error — fails the store and never reaches Pebble.
//
// Pebble does not survive such an error everywhere: closing or creating a
// write-ahead log during rotation panics on it (db.go rotateWAL), and the
// panic unwinds through a deferred unlock of a mutex rotateWAL had already
// released ("fatal error: sync: unlock of unlocked mutex": no recover
// catches it); a failed WAL write makes the next commit panic (commitWrite);
// a failed directory sync when the MANIFEST marker moves panics
// (atomicfs.Marker.Move); a failed MANIFEST write calls Logger.Fatalf
// (versionSet.logAndApply); a failed flush is retried at once, without a
// pause, for as long as the disk says no. So the goroutine that met the error
// — always one of Pebble's own, or one the store started to call Pebble on —
// is parked for good, as storeLogger.Fatalf parks its caller: Pebble never
// reaches a panic or a retry loop, and nothing the relay waits on waits for
// that goroutine (the store's calls into Pebble return its failure instead).
// docs/RATIONALE.md "Why does the store park a Pebble goroutine whose write
// failed instead of returning the error?" lists every operation and why.
type failFS struct {
	vfs.FS
	s *Store
}

// failFile is a file Pebble opened for writing, or a directory it syncs.
type failFile struct {
	vfs.File
	fs   *failFS
	name string
}

// park fails the store with the error op on name returned and stops the
// calling goroutine for good.
func (fs *failFS) park(op, name string, err error) {
	var pathErr *iofs.PathError
	var linkErr *os.LinkError
	if errors.As(err, &pathErr) || errors.As(err, &linkErr) {
		err = fmt.Errorf("%w: %w", ErrWriteFailed, err) // it names the operation and the file
	} else {
		err = fmt.Errorf("%w: %s %s: %w", ErrWriteFailed, op, name, err) // a bare errno (fdatasync)
	}
	fs.s.breakDown(err)
	select {}
}

func (fs *failFS) file(f vfs.File, name string) vfs.File {
	return &failFile{File: f, fs: fs, name: name}
}

func (fs *failFS) Create(name string, category vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.Create(name, category)
	if err != nil {
		fs.park("create", name, err)
	}
	return fs.file(f, name), nil
}

func (fs *failFS) OpenReadWrite(name string, category vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := fs.FS.OpenReadWrite(name, category, opts...)
	if err != nil {
		fs.park("open for writing", name, err)
	}
	return fs.file(f, name), nil
}

func (fs *failFS) ReuseForWrite(oldname, newname string, category vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.ReuseForWrite(oldname, newname, category)
	if err != nil {
		fs.park("reuse "+oldname+" as", newname, err)
	}
	return fs.file(f, newname), nil
}

// OpenDir's handle is only synced (after a file is created, renamed or
// removed): a failed sync parks. Opening it fails only where Pebble returns
// the error to its caller.
func (fs *failFS) OpenDir(name string) (vfs.File, error) {
	f, err := fs.FS.OpenDir(name)
	if err != nil {
		return nil, err
	}
	return fs.file(f, name), nil
}

func (fs *failFS) Rename(oldname, newname string) error {
	if err := fs.FS.Rename(oldname, newname); err != nil {
		fs.park("rename "+oldname+" to", newname, err)
	}
	return nil
}

func (fs *failFS) Link(oldname, newname string) error {
	if err := fs.FS.Link(oldname, newname); err != nil {
		fs.park("link "+oldname+" to", newname, err)
	}
	return nil
}

// Remove, RemoveAll, MkdirAll, Lock, the reads and Preallocate pass through
// unchanged: Pebble tolerates a failed removal (the file stays obsolete),
// ignores a failed preallocation (the write that follows reports the disk),
// and returns the rest to pebble.Open's caller — a LOCK another process
// holds must stay ErrLocked.

func (f *failFile) Write(p []byte) (int, error) {
	n, err := f.File.Write(p)
	if err != nil {
		f.fs.park("write", f.name, err)
	}
	return n, nil
}

func (f *failFile) WriteAt(p []byte, off int64) (int, error) {
	n, err := f.File.WriteAt(p, off)
	if err != nil {
		f.fs.park("write", f.name, err)
	}
	return n, nil
}

func (f *failFile) Sync() error {
	if err := f.File.Sync(); err != nil {
		f.fs.park("sync", f.name, err)
	}
	return nil
}

func (f *failFile) SyncData() error {
	if err := f.File.SyncData(); err != nil {
		f.fs.park("sync", f.name, err)
	}
	return nil
}

func (f *failFile) SyncTo(length int64) (bool, error) {
	full, err := f.File.SyncTo(length)
	if err != nil {
		f.fs.park("sync", f.name, err)
	}
	return full, nil
}

// Close of a written file can report a write the kernel deferred (NFS,
// some FUSE file systems): it parks like the write.
func (f *failFile) Close() error {
	if err := f.File.Close(); err != nil {
		f.fs.park("close", f.name, err)
	}
	return nil
}
