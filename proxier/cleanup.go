package proxier

import (
	"context"
	"errors"
	"fmt"

	"sigs.k8s.io/knftables"
)

// Cleanup deletes the proxier's table in each family, if it exists, and touches
// nothing else. newNFT opens each family's table (DefaultNewNFT for the kernel).
func Cleanup(ctx context.Context, newNFT NewNFTFunc, table string, families ...knftables.Family) error {
	if len(families) == 0 {
		families = Families
	}
	var errs []error
	for _, fam := range families {
		nft, err := newNFT(fam, table)
		if err != nil {
			errs = append(errs, fmt.Errorf("cleanup of table %s %s: %w", fam, table, err))
			continue
		}
		tx := nft.NewTransaction()
		// Adding first makes the delete succeed whether or not the table exists.
		tx.Add(&knftables.Table{})
		tx.Delete(&knftables.Table{})
		if err := nft.Run(ctx, tx); err != nil {
			errs = append(errs, fmt.Errorf("cleanup of table %s %s: %w", fam, table, err))
		}
	}
	return errors.Join(errs...)
}
