// Command seatservice is an HTTP service of timed seat holds with
// conditional.Holds: a passenger holds a seat for HOLD_TTL, then confirms
// it (pays) or releases it. Every change is one conditional UPDATE judged
// by the database's clock, so a seat never has two holders, and a
// passenger whose hold ran out cannot confirm a seat another has taken
// since.
//
// Environment:
//
//	DATABASE_URL  PostgreSQL (required); the holds table is created at start
//	HOLD_TTL      how long a hold lasts (default 10m)
//	ADDR          listen address (default :8080)
//
// There is no reaper: Holds never deletes a row, and a hold past its end
// counts as free to every call, so nothing needs sweeping.
//
// Try it:
//
//	DATABASE_URL=postgres://postgres@localhost:5432/postgres go run ./examples/seatservice
//	curl -X PUT localhost:8080/seats/1A; curl -X PUT localhost:8080/seats/1B
//	curl -X POST localhost:8080/seats/1A/hold -d '{"holder": "alice"}'
//	curl -X POST localhost:8080/seats/1A/hold -d '{"holder": "bob"}'               # 409: held
//	curl -X POST localhost:8080/holds -d '{"holder": "bob", "seats": ["1A", "1B"]}' # any free one: 1B
//	curl -X POST localhost:8080/seats/1A/confirm -d '{"holder": "alice"}'
//	curl -X POST localhost:8080/seats/1B/release -d '{"holder": "bob"}'
//	curl localhost:8080/seats/1A
package main

import (
	"errors"
	"net/http"
	"time"

	"github.com/nolock/nolock/conditional"
	"github.com/nolock/nolock/examples/internal/service"
)

func main() {
	s := service.New("seatservice")
	s.Require("DATABASE_URL")
	ttl := s.Duration("HOLD_TTL", 10*time.Minute)
	pool := s.Postgres()
	holds, err := conditional.NewHolds(pool, conditional.WithObserver(s.Observer()))
	if err != nil {
		s.Fatal(err)
	}
	s.OnStop(holds.Close)
	if err := holds.CreateSchema(s.Context()); err != nil {
		s.Fatal(err)
	}
	seats := seats{holds, ttl}
	s.HandleFunc("PUT /seats/{seat}", seats.add)
	s.HandleFunc("GET /seats/{seat}", seats.get)
	s.HandleFunc("POST /seats/{seat}/hold", seats.hold)
	s.HandleFunc("POST /seats/{seat}/confirm", seats.confirm)
	s.HandleFunc("POST /seats/{seat}/release", seats.release)
	s.HandleFunc("POST /holds", seats.holdAny)
	s.Run()
}

type seats struct {
	holds *conditional.Holds
	ttl   time.Duration
}

// status is a seat's state in answers.
type status struct {
	Seat      string     `json:"seat"`
	Holder    string     `json:"holder,omitempty"`
	Until     *time.Time `json:"until,omitempty"` // on the database's clock
	Confirmed bool       `json:"confirmed,omitempty"`
}

type request struct {
	Holder string   `json:"holder"`
	Seats  []string `json:"seats,omitempty"` // POST /holds only
}

func (ss seats) add(w http.ResponseWriter, r *http.Request) {
	if err := ss.holds.Add(r.Context(), r.PathValue("seat")); err != nil {
		fail(w, err)
		return
	}
	ss.get(w, r)
}

func (ss seats) get(w http.ResponseWriter, r *http.Request) {
	st, err := ss.holds.Get(r.Context(), r.PathValue("seat"))
	if err != nil {
		fail(w, err)
		return
	}
	out := status{Seat: st.Resource, Holder: st.Holder, Confirmed: st.Confirmed}
	if !st.Until.IsZero() {
		out.Until = &st.Until
	}
	service.JSON(w, http.StatusOK, out)
}

func (ss seats) hold(w http.ResponseWriter, r *http.Request) {
	var req request
	if !readHolder(w, r, &req) {
		return
	}
	seat := r.PathValue("seat")
	until, err := ss.holds.Hold(r.Context(), seat, req.Holder, ss.ttl)
	if err != nil {
		fail(w, err)
		return
	}
	service.JSON(w, http.StatusOK, status{Seat: seat, Holder: req.Holder, Until: &until})
}

// holdAny holds whichever of the seats is free.
func (ss seats) holdAny(w http.ResponseWriter, r *http.Request) {
	var req request
	if !readHolder(w, r, &req) {
		return
	}
	seat, until, err := ss.holds.HoldAny(r.Context(), req.Seats, req.Holder, ss.ttl)
	if err != nil {
		fail(w, err)
		return
	}
	service.JSON(w, http.StatusOK, status{Seat: seat, Holder: req.Holder, Until: &until})
}

func (ss seats) confirm(w http.ResponseWriter, r *http.Request) {
	var req request
	if !readHolder(w, r, &req) {
		return
	}
	if err := ss.holds.Confirm(r.Context(), r.PathValue("seat"), req.Holder); err != nil {
		fail(w, err)
		return
	}
	service.JSON(w, http.StatusOK, status{Seat: r.PathValue("seat"), Holder: req.Holder, Confirmed: true})
}

func (ss seats) release(w http.ResponseWriter, r *http.Request) {
	var req request
	if !readHolder(w, r, &req) {
		return
	}
	if err := ss.holds.Release(r.Context(), r.PathValue("seat"), req.Holder); err != nil {
		fail(w, err)
		return
	}
	service.JSON(w, http.StatusOK, status{Seat: r.PathValue("seat")})
}

func readHolder(w http.ResponseWriter, r *http.Request, req *request) bool {
	if !service.ReadJSON(w, r, req) {
		return false
	}
	if req.Holder == "" {
		service.Error(w, http.StatusBadRequest, "holder is required")
		return false
	}
	return true
}

// fail answers with the status err means: 409 for a seat held, confirmed
// or not the holder's, 404 for no such seat, 400 for bad input, 503 when
// the outcome is unknown (retry: every call here is idempotent).
func fail(w http.ResponseWriter, err error) {
	status := http.StatusInternalServerError
	switch {
	case errors.Is(err, conditional.ErrHeld), errors.Is(err, conditional.ErrConfirmed), errors.Is(err, conditional.ErrNotHolder):
		status = http.StatusConflict
	case errors.Is(err, conditional.ErrNotFound):
		status = http.StatusNotFound
	case errors.Is(err, conditional.ErrInvalid):
		status = http.StatusBadRequest
	case errors.Is(err, conditional.ErrAmbiguousCommit):
		status = http.StatusServiceUnavailable
	}
	service.Error(w, status, err.Error())
}
