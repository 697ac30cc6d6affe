//! `mca_btl_udbtl`: udbtl as an Open MPI 4.1 BTL component.
