// The runtime's side of the direct path (direct.cpp): metadata-only Backup/Restore, with the data
// moved by the daemon itself (npusimDaemonExport/Import, export.h). Fields are guarded by
// runtime().mu.
#pragma once

namespace npusim::rt {

struct DataPath {
  bool next_external = false;    // npusimSnapshotSetDataPath(1): the next Backup copies no data
  bool backup_external = false;  // the backup held now (BACKED_UP) left its data to an exporter
};

DataPath &data_path();

}  // namespace npusim::rt
