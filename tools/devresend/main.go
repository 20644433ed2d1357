// Command devresend is a stand-in for the part of the Resend API that the
// service calls for received email, so that `make dev` can take an
// email.received delivery end to end, and run the Resend sweep, without
// Resend: it serves the mails kept under testdata/devresend, in the shapes
// Resend documents (that directory's README names each page). It is for
// development only: it checks nothing a real API would, and it is never
// built into the image (the Dockerfile builds ./cmd/munchable-webhooks
// alone).
//
//	devresend [-addr 127.0.0.1:0] [-data testdata/devresend] [-env-file FILE] [-- command args...]
//
// It answers, with RESEND_API_KEY (from its environment) as the only key:
//
//	GET /emails/receiving?limit=&after=&before=    List Received Emails, newest first
//	GET /emails/receiving/{email_id}               Retrieve Received Email
//	GET /emails/receiving/{email_id}/attachments   List Attachments, each download_url pointing here
//	GET /cdn/{email_id}/attachments/{id}?signature=...  the download (no key, as Resend's CDN)
//	POST /emails                                   Send Email: prints what it would have sent
//	                                               (send.go), with Resend's Idempotency-Key rule
//
// and Resend's JSON errors otherwise. Each mail is a directory named by its
// email id, holding email.json (the Retrieve Received Email answer, with
// its attachments listed; the list's entry is its id, to, from,
// created_at, subject, bcc, cc, reply_to, message_id and attachments) and
// attachments/{filename}, their content.
//
// With a command, devresend runs it with RESEND_API_URL set to its own URL
// (unless RESEND_API_URL is already set: then it only runs the command),
// serves until the command ends, and exits with the command's status. The
// command stays in devresend's process group, so a signal to that group
// (withservers sends one on Ctrl-C) reaches both; devresend catches it and
// leaves it to the command, so it keeps serving while the service drains,
// and ends with it. -env-file appends RESEND_API_URL, as the command gets
// it, to FILE (withservers' env file), so that another shell reaches the
// same API (events retry). `make dev` runs
//
//	withservers ... -- devresend -env-file .dev/env -- ... bin/munchable-webhooks serve
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/munchable/munchable-webhooks/tools/devrun"
)

func main() {
	code, err := run(os.Args[1:], os.Environ(), os.Stdout, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "devresend:", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

// urlEnv is the variable that points the service at the Resend API.
const urlEnv = "RESEND_API_URL"

func run(args, environ []string, stdout, stderr io.Writer) (int, error) {
	fs := flag.NewFlagSet("devresend", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:0", "`host:port` to listen on (port 0: any free one; the URL is printed and given to the command)")
	data := fs.String("data", "testdata/devresend", "`directory` of the mails to serve: one directory per email id, with email.json and attachments/")
	envFile := fs.String("env-file", "", "`file` to append RESEND_API_URL to, as the command gets it, for `set -a; . FILE` in another shell")
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		return 0, nil
	} else if err != nil {
		return 2, err
	}
	command := fs.Args()

	if devrun.Lookup(environ, urlEnv) != "" && len(command) > 0 {
		fmt.Fprintf(stderr, "devresend: %s is set: not serving, the command uses it\n", urlEnv)
		if err := devrun.AppendEnv(*envFile, [2]string{urlEnv, devrun.Lookup(environ, urlEnv)}); err != nil {
			return 1, err
		}
		return devrun.Run(command, environ, nil, stdout, stderr)
	}

	mails, err := loadMails(*data)
	if err != nil {
		return 1, err
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return 1, err
	}
	base := "http://" + ln.Addr().String()
	srv := &http.Server{
		Handler:           newAPI(mails, devrun.Lookup(environ, "RESEND_API_KEY"), stderr),
		ReadHeaderTimeout: 5 * time.Second,
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-served
	}()
	fmt.Fprintf(stderr, "devresend: dev-only stand-in for the Resend API on %s, serving %d received email(s) from %s\n", base, len(mails), *data)
	if err := devrun.AppendEnv(*envFile, [2]string{urlEnv, base}); err != nil {
		return 1, err
	}

	if len(command) == 0 {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		select {
		case <-ctx.Done():
			return 0, nil
		case err := <-served:
			return 1, err
		}
	}
	return devrun.Run(command, environ, []string{urlEnv + "=" + base}, stdout, stderr)
}

// mail is one received email: its Retrieve Received Email answer, its
// entry in List Received Emails and its attachments' contents.
type mail struct {
	email       json.RawMessage
	listed      listedEmail
	created     time.Time
	attachments []attachment
}

// listedEmail is a received email as List Received Emails lists it
// (https://resend.com/docs/api-reference/emails/list-received-emails):
// these fields of the Retrieve Received Email answer, under the same names,
// copied as email.json has them; its attachments without download URLs.
type listedEmail struct {
	ID          string          `json:"id"`
	To          json.RawMessage `json:"to"`
	From        json.RawMessage `json:"from"`
	CreatedAt   string          `json:"created_at"`
	Subject     json.RawMessage `json:"subject"`
	Bcc         json.RawMessage `json:"bcc"`
	Cc          json.RawMessage `json:"cc"`
	ReplyTo     json.RawMessage `json:"reply_to"`
	MessageID   json.RawMessage `json:"message_id"`
	Attachments []attachment    `json:"attachments"`
}

// attachment is one attachment as email.json lists it, with its file. Its
// JSON is the attachment of a List Received Emails entry.
type attachment struct {
	ID                 string  `json:"id"`
	Filename           string  `json:"filename"`
	ContentType        string  `json:"content_type"`
	ContentDisposition *string `json:"content_disposition"`
	ContentID          *string `json:"content_id"`
	Size               int64   `json:"size"`
	path               string
}

// loadMails reads every mail under dir, and refuses data that would make
// the stand-in answer something Resend would not: an email whose id is not
// its directory's, whose created_at is not a time (the list is ordered by
// it), or an attachment whose listed size is not its file's.
func loadMails(dir string) (map[string]mail, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	mails := map[string]mail{}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		id := e.Name()
		raw, err := os.ReadFile(filepath.Join(dir, id, "email.json"))
		if err != nil {
			return nil, err
		}
		var email listedEmail
		if err := json.Unmarshal(raw, &email); err != nil {
			return nil, fmt.Errorf("%s/email.json: %w", id, err)
		}
		if email.ID != id {
			return nil, fmt.Errorf("%s/email.json: id %q, want its directory's name", id, email.ID)
		}
		created, err := parseCreated(email.CreatedAt)
		if err != nil {
			return nil, fmt.Errorf("%s/email.json: %w", id, err)
		}
		for i, a := range email.Attachments {
			a.path = filepath.Join(dir, id, "attachments", a.Filename)
			info, err := os.Stat(a.path)
			if err != nil {
				return nil, fmt.Errorf("%s: attachment %s: %w", id, a.ID, err)
			}
			if info.Size() != a.Size {
				return nil, fmt.Errorf("%s/email.json lists %s with size %d, the file has %d bytes", id, a.Filename, a.Size, info.Size())
			}
			email.Attachments[i] = a
		}
		if email.Attachments == nil {
			email.Attachments = []attachment{} // listed as [], as Resend does
		}
		mails[id] = mail{email: raw, listed: email, created: created, attachments: email.Attachments}
	}
	if len(mails) == 0 {
		return nil, fmt.Errorf("%s holds no mail (a directory per email id, with email.json)", dir)
	}
	return mails, nil
}

// parseCreated reads a created_at as Resend writes them: RFC 3339 in
// Retrieve Received Email's example, Postgres's form ("2025-10-09
// 14:37:40.951732+00") in List Received Emails'.
func parseCreated(s string) (time.Time, error) {
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02 15:04:05.999999999Z07", "2006-01-02 15:04:05.999999999Z07:00"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("created_at %q is not a time", s)
}

// signature stands for the signed query of Resend's download URLs: the
// download refuses a URL without it, as the CDN does.
const signature = "dev-only"

// newAPI returns the stand-in's routes.
func newAPI(mails map[string]mail, apiKey string, log io.Writer) http.Handler {
	listed := newestFirst(mails)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /emails/receiving", func(w http.ResponseWriter, r *http.Request) {
		if !authorized(w, r, apiKey) {
			return
		}
		page, err := listPage(listed, r.URL.Query())
		if err != nil {
			apiError(w, http.StatusUnprocessableEntity, "validation_error", err.Error())
			return
		}
		writeJSON(w, http.StatusOK, page)
	})
	mux.HandleFunc("GET /emails/receiving/{id}", func(w http.ResponseWriter, r *http.Request) {
		m, ok := authorizedMail(w, r, mails, apiKey)
		if !ok {
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(m.email)
	})
	mux.HandleFunc("GET /emails/receiving/{id}/attachments", func(w http.ResponseWriter, r *http.Request) {
		m, ok := authorizedMail(w, r, mails, apiKey)
		if !ok {
			return
		}
		writeJSON(w, http.StatusOK, attachmentList(m, "http://"+r.Host, r.PathValue("id")))
	})
	mux.HandleFunc("GET /cdn/{email}/attachments/{id}", func(w http.ResponseWriter, r *http.Request) {
		download(w, r, mails)
	})
	mux.HandleFunc("POST /emails", newOutbox(log).send(apiKey))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		apiError(w, http.StatusNotFound, "not_found", "The requested endpoint does not exist.")
	})
	return logRequests(mux, log)
}

// authorized checks the API key, answering the error Resend would when it
// is missing or wrong.
func authorized(w http.ResponseWriter, r *http.Request, apiKey string) bool {
	key, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	switch {
	case !ok || key == "":
		apiError(w, http.StatusUnauthorized, "missing_api_key", "Missing API key in the authorization header.")
		return false
	case apiKey != "" && key != apiKey:
		apiError(w, http.StatusForbidden, "invalid_api_key", "API key is invalid.")
		return false
	}
	return true
}

// authorizedMail checks the API key and finds the mail the path names,
// answering the error Resend would when either fails.
func authorizedMail(w http.ResponseWriter, r *http.Request, mails map[string]mail, apiKey string) (mail, bool) {
	if !authorized(w, r, apiKey) {
		return mail{}, false
	}
	m, ok := mails[r.PathValue("id")]
	if !ok {
		apiError(w, http.StatusNotFound, "not_found", "Email not found")
	}
	return m, ok
}

// newestFirst is every mail's list entry, newest first by created_at; of
// two created at the same instant, the greater id first (as the service's
// own test fake of the list orders them).
func newestFirst(mails map[string]mail) []listedEmail {
	all := slices.Collect(maps.Values(mails))
	slices.SortFunc(all, func(a, b mail) int {
		if c := b.created.Compare(a.created); c != 0 {
			return c
		}
		return strings.Compare(b.listed.ID, a.listed.ID)
	})
	listed := make([]listedEmail, len(all))
	for i, m := range all {
		listed[i] = m.listed
	}
	return listed
}

// listPage is the List Received Emails answer for query, from all (newest
// first), as https://resend.com/docs/api-reference/emails/list-received-emails
// and https://resend.com/docs/api-reference/pagination describe it: limit
// 1 to 100; after an id, the entries older than it; before an id, the
// entries newer than it, the nearest limit of them; the id itself
// excluded; has_more when entries lie beyond the page in the direction it
// went. Without a limit, the endpoint's page says all emails come in one
// answer (the pagination page's default of 20 is for the endpoints that
// always paginate), so all do.
//
// The pages say that after and before may not be used together, and give
// limit's bounds, but not what Resend answers otherwise; nor what an id
// that is not listed does. The stand-in refuses all of these with
// validation_error and 422, the status internal/resendhook's test fake
// answers to a bad limit (the Errors page also lists validation_error
// under 400): the service never sends them, so only that it is refused
// matters. An unknown cursor gets an error, not an empty page: the mails
// do not change while the stand-in serves, so one is a client's bug.
func listPage(all []listedEmail, query url.Values) (map[string]any, error) {
	limit := len(all)
	if s := query.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 100 {
			return nil, fmt.Errorf("limit is %q: it must be a number from 1 to 100", s)
		}
		limit = n
	}
	after, before := query.Get("after"), query.Get("before")
	index := func(name, id string) (int, error) {
		i := slices.IndexFunc(all, func(e listedEmail) bool { return e.ID == id })
		if i < 0 {
			return 0, fmt.Errorf("%s is %q: no received email has that id", name, id)
		}
		return i, nil
	}
	var page []listedEmail
	more := false
	switch {
	case after != "" && before != "":
		return nil, errors.New("use after or before, not both")
	case before != "":
		i, err := index("before", before)
		if err != nil {
			return nil, err
		}
		lo := max(i-limit, 0)
		page, more = all[lo:i], lo > 0
	default:
		lo := 0
		if after != "" {
			i, err := index("after", after)
			if err != nil {
				return nil, err
			}
			lo = i + 1
		}
		hi := min(lo+limit, len(all))
		page, more = all[lo:hi], hi < len(all)
	}
	return map[string]any{"object": "list", "has_more": more, "data": page}, nil
}

// attachmentList is the List Attachments answer for m, with download URLs
// on base, valid for an hour as Resend's are.
func attachmentList(m mail, base, emailID string) map[string]any {
	expires := time.Now().Add(time.Hour).UTC().Format("2006-01-02T15:04:05.000Z")
	data := make([]map[string]any, 0, len(m.attachments))
	for _, a := range m.attachments {
		data = append(data, map[string]any{
			"id":                  a.ID,
			"filename":            a.Filename,
			"size":                a.Size,
			"content_type":        a.ContentType,
			"content_disposition": a.ContentDisposition,
			"content_id":          a.ContentID,
			"download_url":        base + "/cdn/" + url.PathEscape(emailID) + "/attachments/" + url.PathEscape(a.ID) + "?signature=" + signature,
			"expires_at":          expires,
		})
	}
	return map[string]any{"object": "list", "has_more": false, "data": data}
}

// download serves an attachment's content as the CDN does: no API key (the
// service must never send it there), the signature in the query.
func download(w http.ResponseWriter, r *http.Request, mails map[string]mail) {
	if r.Header.Get("Authorization") != "" {
		http.Error(w, "the Resend API key must not be sent to a download URL", http.StatusBadRequest)
		return
	}
	if r.URL.Query().Get("signature") != signature {
		http.Error(w, "AccessDenied", http.StatusForbidden)
		return
	}
	for _, a := range mails[r.PathValue("email")].attachments {
		if a.ID == r.PathValue("id") {
			w.Header().Set("Content-Type", a.ContentType)
			http.ServeFile(w, r, a.path)
			return
		}
	}
	http.Error(w, "NoSuchKey", http.StatusNotFound)
}

// apiError writes Resend's error body
// (https://resend.com/docs/api-reference/errors).
func apiError(w http.ResponseWriter, status int, name, message string) {
	writeJSON(w, status, map[string]any{"statusCode": status, "name": name, "message": message})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// logRequests writes one line per request: what the service asked for and
// what it got, beside the service's own log in make dev's terminal.
func logRequests(next http.Handler, log io.Writer) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(sw, r)
		fmt.Fprintf(log, "devresend: %s %s %s\n", r.Method, r.URL.Path, strconv.Itoa(sw.status))
	})
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(status int) {
	w.status = status
	w.ResponseWriter.WriteHeader(status)
}
