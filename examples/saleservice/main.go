// Command saleservice sells a flash sale's stock over HTTP with
// conditional.Stock: every take is one conditional statement that never
// goes below zero, and concurrent takes of one SKU in this process are
// coalesced into one statement per batch, so thousands of buyers at once
// neither oversell nor queue on a lock. A take the stock cannot cover is
// refused (409 sold out); none is half granted.
//
// Environment:
//
//	DATABASE_URL  PostgreSQL (required); the stock table is created at start
//	ADDR          listen address (default :8080)
//
// Stock has no rows to expire, so this service schedules no reaper.
//
// Try it:
//
//	DATABASE_URL=postgres://postgres@localhost:5432/postgres go run ./examples/saleservice
//	curl -X POST localhost:8080/stock/tv-55/restock -d '{"units": 2}'
//	curl -X POST localhost:8080/stock/tv-55/take -d '{"units": 1}'
//	curl -X POST localhost:8080/stock/tv-55/take -d '{"units": 2}'   # 409: sold out
//	curl localhost:8080/stock/tv-55
//
// A take is not idempotent: a client that lost the reply cannot tell
// whether it bought. Put the take and the order in one transaction
// (Stock.TakeIn) under an idempotency key, as examples/walletservice does
// for debits, when buyers retry.
package main

import (
	"net/http"

	"github.com/nolock/nolock/conditional"
	"github.com/nolock/nolock/examples/internal/pgservice"
	"github.com/nolock/nolock/examples/internal/service"
)

func main() {
	s := service.New("saleservice")
	s.Require("DATABASE_URL")
	pool := pgservice.Pool(s)
	stock, err := conditional.NewStock(pool, conditional.WithObserver(s.Observer()))
	if err != nil {
		s.Fatal(err)
	}
	s.OnStop(stock.Close)
	if err := stock.CreateSchema(s.Context()); err != nil {
		s.Fatal(err)
	}
	st := sale{stock}
	s.HandleFunc("GET /stock/{sku}", st.available)
	s.HandleFunc("POST /stock/{sku}/restock", st.restock)
	s.HandleFunc("POST /stock/{sku}/take", st.take)
	s.Run()
}

type sale struct{ stock *conditional.Stock }

type units struct {
	SKU   string `json:"sku,omitempty"`
	Units int64  `json:"units"`
}

func (sl sale) available(w http.ResponseWriter, r *http.Request) {
	n, err := sl.stock.Available(r.Context(), r.PathValue("sku"))
	if err != nil {
		fail(w, err)
		return
	}
	service.JSON(w, http.StatusOK, units{SKU: r.PathValue("sku"), Units: n})
}

// restock adds units, creating the SKU if needed.
func (sl sale) restock(w http.ResponseWriter, r *http.Request) {
	var req units
	if !service.ReadJSON(w, r, &req) {
		return
	}
	if err := sl.stock.Put(r.Context(), r.PathValue("sku"), req.Units); err != nil {
		fail(w, err)
		return
	}
	sl.available(w, r)
}

// take takes the units, all or none.
func (sl sale) take(w http.ResponseWriter, r *http.Request) {
	var req units
	if !service.ReadJSON(w, r, &req) {
		return
	}
	if err := sl.stock.Take(r.Context(), r.PathValue("sku"), req.Units); err != nil {
		fail(w, err)
		return
	}
	service.JSON(w, http.StatusOK, units{SKU: r.PathValue("sku"), Units: req.Units})
}

// fail answers with the status err means (pgservice.Status).
func fail(w http.ResponseWriter, err error) { service.Error(w, pgservice.Status(err), err.Error()) }
